"""params.yaml, parsed once into a typed, frozen, validated config.

params.yaml is the single source of truth. `load_params` validates the whole file before
any work starts: a wrong type, an out-of-range or non-finite value, an unknown key (at any
depth, reward backends' keys included), an unknown reward, a zero total reward weight or,
for stages that read it, a missing or truncated model checkpoint raises one `ParamsError`
that names each offending key with its line in the file and the fix. Nothing deeper in the
package reads files or environment variables for settings.

One default per field: every default below is the value the study's params.yaml sets
(tests/test_params_errors.py::test_code_defaults_are_the_study_values fails when they
drift); `methods` has no default and must be in the file. So a test that builds params
from a few keys runs the study's configuration for all the others.

Validation imports neither torch nor any backend (the reward table is plain data), so
`python -m margrpo.config params.yaml` answers in about a second; a DVC guard stage runs
it before DVC deletes any output. Exit status 2 and the message, no traceback, when the
file does not validate.

The three ablation knobs of method.md §3 are top-level keys (k, tau, num_trajectories) so
that `dvc exp run -S k=0.3` works as typed. Which of them a method reads follows from its
settings (`knobs_read`); dvc.yaml's train stage lists those as the method's params (written
by `python -m pipeline.dvcyaml`) and `Params.method` folds their values into the method.
`claims` says which method plays which part in the report's claims; only the report reads it.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, ValidationError, model_validator

from margrpo import paramfile
from margrpo.checkfiles import CorruptFileError, check_model_dir
from margrpo.paramfile import ParamsError, parse_overrides
# The model and data sections live in config_sections; loading and pretraining import
# ModelConfig, SamplingConfig and PretrainConfig from here.
from margrpo.config_sections import (EvaluateConfig, ModelConfig, PretrainConfig, RewardSpec, RuntimeConfig,
                                     SamplingConfig, Strict, WorldConfig, problem)

__all__ = ["Params", "ParamsError", "load_params", "parse_params", "parse_overrides", "ModelConfig", "PretrainConfig",
           "SamplingConfig"]

# Allowed values of the enumerated keys; modules that branch on them import these.
LR_SCHEDULES = ("constant", "cosine", "linear")
ESTIMATORS = ("single", "resample", "elbo", "posterior")
SDE_WINDOW_MODES = ("fixed", "random", "sliding")
# Estimators whose chains run the forward process from the committed token through every
# head transition (their weights need each transition's density): no SDE window.
WHOLE_CHAIN_ESTIMATORS = ("elbo", "posterior")
CONSISTENCY_RULES = ("paper", "code")
TOKEN_SCOPES = ("committed", "committed+speculative")
TOPK_POOLS = ("image", "ar_step")
MTE_SCOPES = ("loss", "committed")
# A method's own training budget and schedule (MethodConfig fields; their defaults mean "as
# train"): Params.train_for folds them into the method's TrainConfig.
BUDGET_KEYS = ("steps_factor", "batch_factor", "lr_schedule", "warmup_frac")
# Every MethodConfig field that Params.train_for folds into the method's TrainConfig.
IN_TRAIN = (*BUDGET_KEYS, "grad_probe_every")
# The ablation knobs (top-level keys), and the setting that makes a method read each one
# (knobs_read: the token plan of method/plan.py takes the knob from a method of that setting).
KNOBS = ("k", "tau", "num_trajectories")
KNOB_READ_BY = {"k": "topk: true ranks tokens by the top-level k",
                "tau": "consistency: true filters tokens by tau",
                "num_trajectories": "topk: true or a multi-chain estimator draws num_trajectories chains"}
# params.model keys that must equal a checkpoint's config.json (the rest are paths).
ARCH_KEYS = ("patch_size", "width", "depth", "heads", "cond_dim", "head_width", "head_depth", "sampler",
             "flow_shift", "max_prompt_len")
CHECKPOINT_FIX = ("set model.checkpoint to a trained model folder (the study's models/base is committed: "
                  "`git checkout -- models/base` restores it), or train one at {path} with `dvc repro pretrain_base`")

Beta = Annotated[float, Field(ge=0, lt=1)]


class MethodConfig(Strict):
    """One trained method. Vanilla GRPO and MAR-GRPO differ only here (same code path)."""

    freeze_head: bool = Field(description="train the AR transformer only; the diffusion head stays the base's")
    estimator: Literal[ESTIMATORS] = Field(
        "single", description="the log-prob gradient of a scored token: single (the rollout's chain), resample "
        "(M fresh chains, as the paper), elbo or posterior (docs/method.md)")
    topk: bool = Field(False, description="apply the multi-trajectory estimate to the top-k uncertain tokens only")
    consistency: bool = Field(False, description="consistency-aware token selection (tau)")
    consistency_rule: Literal[CONSISTENCY_RULES] = Field(
        "paper", description="consistency score of a speculative token: paper (cosine to the token finally "
        "committed) or code (its gain over the previous step's prediction, as the authors' code)")
    token_scope: Literal[TOKEN_SCOPES] = Field(
        "committed", description="tokens scored at an AR step: those it commits, or also its speculative "
        "predictions of still-masked tokens")
    topk_pool: Literal[TOPK_POOLS] = Field(
        "image", description="rank uncertainty over all of an image's loss tokens (the authors' code: one mask "
        "per image) or within each AR step")
    mte_scope: Literal[MTE_SCOPES] = Field(
        "loss", description="tokens that compete in the top-k for the multi-trajectory estimate: every loss "
        "token (speculative ones too) or only the tokens committed at the AR step (the paper's tokens)")
    lr: float | None = Field(None, gt=0, description="this method's learning rate (default: train.lr); "
                             "methods are tuned separately, as in any fair comparison")
    steps_factor: int = Field(1, ge=1, description="this method trains for steps_factor x train.steps steps (a "
                              "profile that shortens train.steps shortens it alike)")
    batch_factor: int = Field(1, ge=1, description="this method draws batch_factor x train.prompts_per_step prompts "
                              "per step (its images per step scale alike; a profile's smaller batch scales too)")
    lr_schedule: Literal[LR_SCHEDULES] | None = Field(None, description="this method's LR schedule over its own "
                                                      "steps (default: train.lr_schedule)")
    warmup_frac: float | None = Field(None, ge=0, lt=1, description="linear LR warm-up over this fraction of the "
                                      "method's steps (default: train.warmup_steps steps)")
    grad_probe_every: int | None = Field(None, ge=0, description="this method's gradient-probe interval in "
                                         "steps (default: train.grad_probe_every); 0 = off")
    sde_window: int | None = Field(None, ge=0, description="this method's SDE window (default: train.sde_window); "
                                   "0 = every head transition stochastic")
    paired_base: bool = Field(
        False, description="also roll out the base model (the KL reference) on each step's prompts and image "
        "seeds and log its reward (reward/base_mean, reward/vs_base): the control variate of the training-reward test")

    @model_validator(mode="before")
    @classmethod
    def _no_reads(cls, data: Any) -> Any:
        # a hand-written list of the knobs a method reads: name the fix rather than "unknown key"
        if isinstance(data, dict) and "reads" in data:
            raise problem("reads", "is not a setting: the knobs a method reads follow from its settings "
                          f"({'; '.join(KNOB_READ_BY.values())})", "delete the line")
        return data


def knobs_read(m: MethodConfig) -> tuple[str, ...]:
    """The ablation knobs (KNOBS order) a method trains with, from its settings (KNOB_READ_BY);
    dvc.yaml's train@<method> lists them, so changing one retrains exactly the methods that
    read it. A knob the method does not read is off (KNOBS_OFF)."""
    uses = {"k": m.topk, "tau": m.consistency, "num_trajectories": m.topk or m.estimator != "single"}
    return tuple(k for k in KNOBS if uses[k])


BUDGET_DEFAULTS = {k: MethodConfig.model_fields[k].default for k in BUDGET_KEYS}


class Knobs(Strict):
    """The ablation knobs of method.md §3 (top-level keys of params.yaml)."""

    k: float = Field(0.3, ge=0, le=1, description="top uncertain token fraction for MTE")
    tau: float = Field(0.0, ge=-1, le=1, description="consistency threshold (cosine)")
    num_trajectories: int = Field(4, ge=1, description="M extra head chains")


# What a method runs with for a knob it does not read: every token, no consistency filter, one chain.
KNOBS_OFF = Knobs(k=1.0, tau=-1.0, num_trajectories=1)


class ClaimsConfig(Strict):
    """Which method of `methods` plays each part in the report's claims (method.md §6), the
    ablation grid and the long run (report/claims.py, report/ablation.py). Read by the report
    alone: changing it reruns no training or evaluation. A role left out (null) is played by
    no method, and the claims that need it say so."""

    grpo: str | None = Field(None, description="vanilla GRPO: head and transformer trained, one chain per token "
                             "(claims 1, 2 and 5; the long run)")
    grpo_frozen: str | None = Field(None, description="GRPO with the head frozen, one chain, committed tokens: the "
                                    "reference that isolates the multi-trajectory estimate (claims 2, 3 and 6; the "
                                    "ablation's k = 0 point; the long run)")
    resample: str | None = Field(None, description="MAR-GRPO as the paper states it, the `resample` estimator "
                                 "(claims 3 and 5; claim 4 through the ablation; the long run)")
    posterior: str | None = Field(None, description="MAR-GRPO with the corrected `posterior` estimator (claim 4's "
                                  "note through the ablation; the long run)")
    speculative: str | None = Field(None, description="grpo_frozen plus the consistency-filtered speculative tokens "
                                    "(claim 6)")

    def roles(self) -> dict[str, str]:
        """role -> method name, for the roles some method plays."""
        return {role: name for role, name in self.model_dump().items() if name is not None}


def _yaml(value: Any) -> str:
    """A setting as params.yaml writes it (true / false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


# What a role's method must be (claims.<role> names a method with these settings).
ROLE_SETTINGS = {"grpo": {"freeze_head": False, "estimator": "single"},
                 "grpo_frozen": {"freeze_head": True, "estimator": "single", "token_scope": "committed"},
                 "resample": {"estimator": "resample"}, "posterior": {"estimator": "posterior"},
                 "speculative": {"token_scope": "committed+speculative"}}


class TrainConfig(Strict):
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0, 1, 2], min_length=1,
                                                     description="one trained model per seed and method")
    steps: int = Field(20, ge=1, description="RL steps per seed")
    prompts_per_step: int = Field(16, ge=1, description="prompts per step, group_size images each")
    group_size: int = Field(8, ge=2, description="images per prompt: one GRPO group")
    lr: float = Field(2e-4, gt=0, description="AdamW learning rate")
    lr_schedule: Literal[LR_SCHEDULES] = Field("constant", description="LR over the run after the warm-up: "
                                               "constant, or a cosine or linear decay to 0")
    warmup_steps: int = Field(0, ge=0, description="linear LR warm-up steps")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    adam_betas: tuple[Beta, Beta] = Field((0.9, 0.999), description="AdamW betas")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip")
    inner_epochs: int = Field(1, ge=1, description="optimiser passes over each step's rollouts")
    clip_range: float = Field(0.2, gt=0, description="PPO clip of the probability ratio")
    beta_kl: float = Field(0.01, ge=0, description="weight of the KL penalty to the base model")
    cfg_consistent: bool = Field(True, description="score with the guided mean; false = authors' code")
    cfg_null_grad: bool = Field(True, description="with cfg_consistent: also back-propagate through the "
                                "null-prompt branch (the exact gradient of the guided mean)")
    loss_ar_steps: int = Field(0, ge=0, description="random AR steps per rollout in the loss; 0 = all of them")
    loss_head_steps: int = Field(8, ge=1, description="random head steps per AR step in the loss")
    loss_head_window: int = Field(8, ge=0, description="draw the loss head steps from the first N (noisiest) "
                                  "transitions of each chain; 0 = from all of them")
    sde_window: int = Field(0, ge=0, description="stochastic head transitions per token in training rollouts, inside "
                            "the loss_head_window noisiest; the rest are deterministic (ODE) and the loss scores the "
                            "window only; 0 = all stochastic, the paper's chain")
    sde_window_mode: Literal[SDE_WINDOW_MODES] = Field("random", description="the window's place each step: fixed "
                                                       "(sde_window_start), random, or sliding from noisy to clean")
    sde_window_start: int = Field(0, ge=0, description="fixed mode: the window's first head transition")
    eval_every: int = Field(10, ge=0, description="held-out evaluation every N training steps (also at step 0 "
                            "and the last step; the best-scoring weights are kept); 0 = only at 0 and the end")
    eval_images_per_prompt: int = Field(4, ge=1, description="images per held-out prompt in the in-training evaluation")
    checkpoint_every: int = Field(5, ge=1, description="steps between the checkpoints a killed run resumes from")
    grad_probe_every: int = Field(20, ge=0, description="steps between gradient signal-to-noise probes (at step 0, N, 2N, ...); 0 = off")
    max_nonfinite_in_row: int = Field(3, ge=1, description="stop after this many steps in a row with a "
                                      "non-finite loss or gradient (each is skipped)")

    @property
    def cfg_mode(self) -> str:
        """How loss log-probs treat classifier-free guidance (models.chains.guided_output)."""
        if not self.cfg_consistent:
            return "cond"
        return "guided_full" if self.cfg_null_grad else "guided"


class Params(Knobs):
    world: WorldConfig = WorldConfig()
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    sampling: SamplingConfig = SamplingConfig()
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="world", mode="aligned")],
                                      min_length=1, description="the training reward: a weighted sum of these "
                                      "backends (docs/backends.md)")
    train: TrainConfig = TrainConfig()
    methods: dict[str, MethodConfig] = Field(min_length=1, description="the trained methods; no default")
    claims: ClaimsConfig = ClaimsConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    runtime: RuntimeConfig = RuntimeConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> "Params":
        size, patch = self.world.image_size, self.model.patch_size
        if size % patch:
            raise problem("world.image_size", f"{size} is not divisible by model.patch_size={patch}",
                           "choose a patch size that divides the image size (8 for 32 px)")
        n_tokens = (size // patch) ** 2
        s, t = self.sampling, self.train
        if self.model.kind == "tiny" and s.num_ar_steps > n_tokens:
            raise problem("sampling.num_ar_steps", f"{s.num_ar_steps} exceeds the {n_tokens} tokens per image",
                           f"use at most {n_tokens} AR steps (one token per step at least)")
        if self.pretrain.decay_steps > self.pretrain.steps:
            raise problem("pretrain.decay_steps", f"{self.pretrain.decay_steps} exceeds pretrain.steps="
                           f"{self.pretrain.steps}", "decay over at most pretrain.steps steps (0 = no decay)")
        if t.loss_ar_steps > s.num_ar_steps:
            raise problem("train.loss_ar_steps", f"{t.loss_ar_steps} exceeds sampling.num_ar_steps={s.num_ar_steps}",
                           "use at most sampling.num_ar_steps (0 = all of them)")
        if t.loss_head_steps > s.head_steps:
            raise problem("train.loss_head_steps", f"{t.loss_head_steps} exceeds sampling.head_steps={s.head_steps}",
                           "use at most sampling.head_steps")
        window = t.loss_head_window
        if window and not t.loss_head_steps <= window <= s.head_steps:
            raise problem("train.loss_head_window", f"{window} is outside [train.loss_head_steps="
                           f"{t.loss_head_steps}, sampling.head_steps={s.head_steps}]",
                           "choose a window in that range, or 0 for all steps")
        span = window or s.head_steps
        start = t.sde_window_start if t.sde_window_mode == "fixed" else 0  # random / sliding start from 0 up
        for name, m in self.methods.items():
            w = t.sde_window if m.sde_window is None else m.sde_window
            key = "train.sde_window" if m.sde_window is None else f"methods.{name}.sde_window"
            if w and start + w > span:
                raise problem(key, f"a window of {w} from transition {start} ends past the {span} eligible head "
                              "transitions (train.loss_head_window, else sampling.head_steps)",
                              f"use at most {span - start}, or 0 for all")
            if w and m.estimator in WHOLE_CHAIN_ESTIMATORS:
                raise problem(key, f"method {name} uses the {m.estimator} estimator, whose chains need every head "
                              f"transition stochastic", f"set methods.{name}.sde_window: 0")
        if len(set(t.seeds)) != len(t.seeds):
            raise problem("train.seeds", f"{t.seeds} repeats a seed", "list each seed once (one trained model each)")
        total = sum(r.weight for r in self.rewards)
        if total <= 0:
            raise problem("rewards", f"the reward weights sum to {total:g}",
                           "make the total weight positive (a higher reward must mean a better image)")
        for role, name in self.claims.roles().items():
            if name not in self.methods:
                raise problem(f"claims.{role}", f"{name!r} names no method of params.yaml's methods "
                              f"({', '.join(self.methods)})", f"set it to the method that plays {role}, or delete the "
                              "line (no method plays it)")
            settings = self.methods[name].model_dump(mode="json")
            if wrong := {k: v for k, v in ROLE_SETTINGS[role].items() if settings[k] != v}:
                raise problem(f"claims.{role}", f"{name} does not have the settings of the role "
                              f"({', '.join(f'{k}: {_yaml(settings[k])}' for k in wrong)})",
                              f"name a method with {', '.join(f'{k}: {_yaml(v)}' for k, v in wrong.items())}")
        return self

    def reward_specs(self) -> list[dict[str, Any]]:
        """rewards as factory kwargs; the world reward gets world.image_size unless set."""
        specs = [r.model_dump() for r in self.rewards]
        for s in specs:
            if s["name"] == "world":
                s.setdefault("image_size", self.world.image_size)
        return specs

    def train_for(self, name: str) -> "TrainConfig":
        """params.train as the method trains: train.steps x steps_factor steps of train.prompts_per_step x
        batch_factor prompts, at its own learning rate, LR schedule, warm-up and probe interval where it
        sets them. The one place a method's overrides of train.* are resolved."""
        m, t = self.method(name), self.train
        steps = t.steps * m.steps_factor
        update = {"steps": steps, "prompts_per_step": t.prompts_per_step * m.batch_factor,
                  "lr": t.lr if m.lr is None else m.lr,
                  "lr_schedule": m.lr_schedule or t.lr_schedule,
                  "warmup_steps": t.warmup_steps if m.warmup_frac is None else round(m.warmup_frac * steps),
                  "grad_probe_every": t.grad_probe_every if m.grad_probe_every is None else m.grad_probe_every,
                  "sde_window": t.sde_window if m.sde_window is None else m.sde_window}
        return self.train if all(getattr(t, k) == v for k, v in update.items()) else t.model_copy(update=update)

    def method(self, name: str) -> "ResolvedMethod":
        if name not in self.methods:
            raise ParamsError(f"unknown method {name!r}; params.yaml methods: {sorted(self.methods)}")
        m = self.methods[name]
        knobs = {key: getattr(self if key in knobs_read(m) else KNOBS_OFF, key) for key in KNOBS}
        return ResolvedMethod(name=name, **m.model_dump(), **knobs)


class ResolvedMethod(MethodConfig, Knobs):
    """A method as it trains: its block of params.yaml, its name and the knobs it runs with
    (the top-level value of each knob it reads, KNOBS_OFF's for the others)."""

    name: str


def parse_params(raw: Mapping[str, Any] | None, source: str = "params.yaml",
                 overrides: Mapping[str, Any] | None = None, *, require_checkpoint: bool = False,
                 lines: Mapping[tuple, int] | None = None) -> Params:
    """Validate a params tree (e.g. yaml.safe_load of params.yaml). overrides: dotted keys
    -> values, list indices included (`rewards.0.mode`), applied first. require_checkpoint:
    model.checkpoint must be a complete saved model (every stage but pretrain_base, which
    writes it). lines: (key path) -> line in `source`, for the messages."""
    if raw is None:
        raise ParamsError(f"{source} is empty. Restore it with `git checkout -- {source}`.")
    if not isinstance(raw, Mapping):
        raise ParamsError(f"{source}: the top level is a {type(raw).__name__}; expected `key: value` lines. "
                          f"Restore it with `git checkout -- {source}`.")
    raw = paramfile.apply_overrides(raw, overrides or {}, source)
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        raise ParamsError(paramfile.format_errors(err, source, lines or {}, overrides or {}, Params)) from None
    if require_checkpoint:
        _check_model_files(params.model, source, lines or {}, overrides or {})
    return params


def _check_model_files(m: ModelConfig, source: str, lines: Mapping[tuple, int], overrides: Mapping[str, Any]) -> None:
    """The TinyMAR folder at model.checkpoint is complete; an adapter's model.weights is a
    folder (its layout is checked by margrpo.models.published when it is loaded)."""
    key = "checkpoint" if m.kind == "tiny" else "weights"
    path = Path(getattr(m, key))
    try:
        if m.kind == "tiny":
            check_model_dir(path, CHECKPOINT_FIX.format(path=path))
        elif not path.is_dir():
            raise FileNotFoundError(f"{path}: no such folder\n    fix: set model.weights to the published "
                                    f"{m.kind} folder (docs/models.md lists the expected files)")
    except (FileNotFoundError, CorruptFileError) as exc:
        where = paramfile.where(source, lines, ("model", key), overrides)
        raise ParamsError(f"{source} does not validate (1 problem):\n  {where}model.{key}: {exc}") from None


def load_params(path: str | Path = "params.yaml", overrides: Mapping[str, Any] | None = None, *,
                require_checkpoint: bool = False) -> Params:
    """Read and validate params.yaml (see parse_params). Every problem raises ParamsError."""
    raw, lines = paramfile.read_yaml(path)
    return parse_params(raw, str(path), overrides, require_checkpoint=require_checkpoint, lines=lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m margrpo.config",
                                 description="Validate params.yaml before any stage runs (exit 2 if invalid).")
    ap.add_argument("params", nargs="?", default="params.yaml")
    ap.add_argument("--no-checkpoint", action="store_true",
                    help="do not require model.checkpoint to exist (a run that pretrains it)")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="dotted key=value, as dvc exp run -S")
    a = ap.parse_args(argv)
    try:
        params = load_params(a.params, parse_overrides(a.overrides), require_checkpoint=not a.no_checkpoint)
    except ParamsError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{a.params}: valid ({len(params.methods)} methods: {', '.join(params.methods)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
that `dvc exp run -S k=0.3` works as typed; a method names the ones it reads (`reads`, which
dvc.yaml's train stage lists as that method's params) and `Params.method` folds them into it.
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
from margrpo.config_sections import ModelConfig, PretrainConfig, RewardSpec, SamplingConfig, Strict, WorldConfig, problem

__all__ = ["Params", "ParamsError", "load_params", "parse_params", "parse_overrides", "ModelConfig", "PretrainConfig",
           "SamplingConfig"]

# Allowed values of the enumerated keys; modules that branch on them import these.
LR_SCHEDULES = ("constant", "cosine", "linear")
ESTIMATORS = ("single", "resample", "elbo", "posterior")
CONSISTENCY_RULES = ("paper", "code")
TOKEN_SCOPES = ("committed", "committed+speculative")
TOPK_POOLS = ("image", "ar_step")
MTE_SCOPES = ("loss", "committed")
# A method's own training budget and schedule (MethodConfig fields; their defaults mean "as
# train"): Params.train_for folds them into the method's TrainConfig.
BUDGET_KEYS = ("steps_factor", "batch_factor", "lr_schedule", "warmup_frac")
# Every MethodConfig field that Params.train_for folds into the method's TrainConfig.
IN_TRAIN = (*BUDGET_KEYS, "grad_probe_every")
# The ablation knobs (top-level keys) and the entry of a method's `reads` that names none of
# them: `train`, which every train stage lists anyway. DVC cannot splice a list into a
# stage's `params:`, so dvc.yaml's train stage lists `reads` entry by entry: READ_SLOTS of them.
KNOBS = ("k", "tau", "num_trajectories")
NO_KNOB = "train"
READ_SLOTS = 3
READS_FIX = ("add `reads: [train, train, train]` to the method if it reads none of k, tau, num_trajectories, "
             "else name those it reads, e.g. [k, tau, num_trajectories] or [tau, train, train]")
# params.model keys that must equal a checkpoint's config.json (the rest are paths).
ARCH_KEYS = ("patch_size", "width", "depth", "heads", "cond_dim", "head_width", "head_depth", "sampler",
             "flow_shift", "max_prompt_len")
CHECKPOINT_FIX = ("set model.checkpoint to a trained model folder (the study's models/base is committed: "
                  "`git checkout -- models/base` restores it), or train one at {path} with `dvc repro pretrain_base`")

Beta = Annotated[float, Field(ge=0, lt=1)]
ReadKey = Literal[(*KNOBS, NO_KNOB)]


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
    paired_base: bool = Field(
        False, description="also roll out the base model (the KL reference) on each step's prompts and image "
        "seeds and log its reward (reward/base_mean, reward/vs_base): the control variate of the training-reward test")
    reads: tuple[ReadKey, ...] = Field(  # READ_SLOTS entries (_has_reads)
        description="the top-level knobs this method trains with (k, tau, num_trajectories), padded with `train` "
        "to three entries; dvc.yaml's train stage lists them as the method's params, so changing a knob retrains "
        "exactly the methods that read it. A knob the method does not read is off: k 1, tau -1, num_trajectories 1")

    @model_validator(mode="before")
    @classmethod
    def _has_reads(cls, data: Any) -> Any:
        # dvc.yaml reads `reads` from the file itself (no default can reach it) and lists
        # exactly READ_SLOTS entries: name the fix rather than pydantic's tuple errors
        if not isinstance(data, dict):
            return data
        if "reads" not in data:
            raise problem("reads", f"missing: dvc.yaml's train stage lists a method's {READ_SLOTS} `reads` entries "
                          "as its params", READS_FIX)
        reads = data["reads"]
        if not isinstance(reads, (list, tuple)) or len(reads) != READ_SLOTS:
            raise problem("reads", f"{reads!r} is not a list of {READ_SLOTS} entries (dvc.yaml's train stage lists "
                          f"{READ_SLOTS})", READS_FIX)
        return data

    @model_validator(mode="after")
    def _reads_what_it_uses(self) -> "MethodConfig":
        knobs = [r for r in self.reads if r != NO_KNOB]
        if len(set(knobs)) != len(knobs):
            raise problem("reads", f"{list(self.reads)} names a knob twice",
                          f"name each of {', '.join(KNOBS)} at most once and fill the rest with {NO_KNOB}")
        # the knobs the token plan (method/plan.py) takes from a method of these settings
        uses = {"k": self.topk, "num_trajectories": self.topk or self.estimator != "single", "tau": self.consistency}
        unread = [k for k in KNOBS if uses[k] and k not in knobs]
        if unread:
            why = {"k": "topk: true ranks tokens by the top-level k",
                   "num_trajectories": "its uncertainty or estimator chains number num_trajectories",
                   "tau": "consistency: true filters tokens by tau"}
            raise problem("reads", f"{list(self.reads)} leaves out {', '.join(unread)}, which this method uses "
                          f"({'; '.join(why[k] for k in unread)})", f"name {', '.join(unread)} in reads in place "
                          f"of {NO_KNOB}, so that changing {'it' if len(unread) == 1 else 'them'} retrains this method")
        return self


BUDGET_DEFAULTS = {k: MethodConfig.model_fields[k].default for k in BUDGET_KEYS}


class Knobs(Strict):
    """The ablation knobs of method.md §3 (top-level keys of params.yaml)."""

    k: float = Field(0.3, ge=0, le=1, description="top uncertain token fraction for MTE")
    tau: float = Field(0.0, ge=-1, le=1, description="consistency threshold (cosine)")
    num_trajectories: int = Field(4, ge=1, description="M extra head chains")


# What a method runs with for a knob it does not read: every token, no consistency filter, one chain.
KNOBS_OFF = Knobs(k=1.0, tau=-1.0, num_trajectories=1)


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


class EvaluateConfig(Strict):
    images_per_prompt: int = Field(2, ge=1, description="images per test prompt and seed")
    seed: int = Field(1234, description="seed of the per-image seeds, the same for every target")
    batch_size: int = Field(64, ge=1, description="images per sampling batch of every evaluation (held-out during "
                            "training, test, sample_baseline)")
    grid_prompts: int = Field(8, ge=1, description="prompts shown in a sample grid (grid.png)")


class RuntimeConfig(Strict):
    """Where and how the model computes (margrpo.models.device.place) and over how many
    processes and machines (margrpo.ranks.launch)."""

    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when PyTorch sees a GPU, else CPU")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="transformer / head forward passes; log-probs, advantages and losses stay float32")
    nproc: int | Literal["auto"] = Field(
        "auto", description="torchrun ranks per node that train and evaluate data-parallel (1 = one process); auto: "
        "one per visible GPU on CUDA, 2 on the CPU, lowered until every method's prompts per step split into whole "
        "groups per rank")
    nnodes: int = Field(1, ge=1, description="machines of a multi-node run; a scheduler starts each stage once per "
                        "node, and every node must see the same workspace (a shared filesystem)")
    rdzv_endpoint: str = Field("", description="host:port of torchrun's c10d rendezvous when nnodes > 1; empty: "
                               "$MASTER_ADDR:$MASTER_PORT (port 29500 when unset)")

    @model_validator(mode="before")
    @classmethod
    def _nproc(cls, data: Any) -> Any:
        # one message for both forms (pydantic would report the int and the literal apart)
        nproc = data.get("nproc", "auto") if isinstance(data, dict) else "auto"
        if nproc != "auto" and (isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1):
            raise problem("nproc", f"{nproc!r} is neither a positive number of ranks nor auto",
                          "set it to auto (one rank per GPU, 2 on the CPU) or to a number of ranks >= 1")
        return data

    @model_validator(mode="after")
    def _endpoint(self) -> "RuntimeConfig":
        if self.rdzv_endpoint:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise problem("rdzv_endpoint", f"{self.rdzv_endpoint!r} is not host:port",
                              "give the first node's host name or address and a free port, e.g. node01:29500")
        return self


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
        if len(set(t.seeds)) != len(t.seeds):
            raise problem("train.seeds", f"{t.seeds} repeats a seed", "list each seed once (one trained model each)")
        total = sum(r.weight for r in self.rewards)
        if total <= 0:
            raise problem("rewards", f"the reward weights sum to {total:g}",
                           "make the total weight positive (a higher reward must mean a better image)")
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
                  "grad_probe_every": t.grad_probe_every if m.grad_probe_every is None else m.grad_probe_every}
        return self.train if all(getattr(t, k) == v for k, v in update.items()) else t.model_copy(update=update)

    def method(self, name: str) -> "ResolvedMethod":
        if name not in self.methods:
            raise ParamsError(f"unknown method {name!r}; params.yaml methods: {sorted(self.methods)}")
        m = self.methods[name]
        knobs = {key: getattr(self if key in m.reads else KNOBS_OFF, key) for key in KNOBS}
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

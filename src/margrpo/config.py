"""params.yaml, parsed once into a typed, frozen, validated config.

params.yaml is the single source of truth. `load_params` validates the whole file before
any work starts: a wrong type, an out-of-range value or an unknown key raises one
`ParamsError` that names the key, what was given and what is allowed. Nothing deeper in the
package reads files or environment variables for settings.

The three ablation knobs of method.md §3 are top-level keys (k, tau, num_trajectories) so
that `dvc exp run -S k=0.3` works as typed; `MethodConfig.resolved` folds them into the
MAR-GRPO method.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ParamsError(ValueError):
    """params.yaml does not validate; the message names every offending key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldConfig(_Strict):
    image_size: int = Field(32, ge=8, description="pixels; must be divisible by model.patch_size")
    train_prompts_per_tag: int = Field(64, ge=1)
    heldout_prompts_per_tag: int = Field(16, ge=1)
    seed: int = 0


class ModelConfig(_Strict):
    checkpoint: str = Field("models/base", description="folder with config.json + safetensors")
    patch_size: int = Field(8, ge=1)
    width: int = Field(192, ge=16)
    depth: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    cond_dim: int = Field(192, ge=8)
    head_width: int = Field(256, ge=16)
    head_depth: int = Field(3, ge=1)
    sampler: Literal["ddpm", "flow"] = "ddpm"
    flow_shift: float = Field(1.0, gt=0, description="flow sampler only: sigma shift (>1 spends more "
                              "training and sampling on high noise, where a token's colour and shape are decided)")
    max_prompt_len: int = Field(16, ge=4)


class PretrainConfig(_Strict):
    steps: int = Field(8000, ge=1)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    warmup_steps: int = Field(300, ge=1)
    decay_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.02, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    ema_decay: float = Field(0.999, ge=0, lt=1)
    prompt_dropout: float = Field(0.1, ge=0, lt=1)
    diffusion_batch_mul: int = Field(4, ge=1)
    seed: int = 0
    log_every: int = Field(50, ge=1)
    compile: bool = False


class SamplingConfig(_Strict):
    num_ar_steps: int = Field(16, ge=1)
    head_steps: int = Field(20, ge=2)
    cfg_scale: float = Field(3.0, ge=0)
    temperature: float = Field(1.0, gt=0)


class RewardSpec(BaseModel):
    # Backend kwargs pass through to the reward factory, which validates them.
    model_config = ConfigDict(extra="allow", frozen=True)
    name: str
    weight: float = 1.0


class MethodConfig(_Strict):
    """One trained method. Vanilla GRPO and MAR-GRPO differ only here (same code path)."""

    freeze_head: bool
    estimator: Literal["single", "resample", "elbo", "posterior"] = "single"
    topk: bool = Field(False, description="apply the multi-trajectory estimate to the top-k uncertain tokens only")
    consistency: bool = Field(False, description="consistency-aware token selection (tau)")
    consistency_rule: Literal["paper", "code"] = "paper"
    token_scope: Literal["committed", "committed+speculative"] = "committed"
    mte_scope: Literal["loss", "committed"] = Field(
        "loss", description="tokens that compete in the top-k for the multi-trajectory estimate: every loss "
        "token (speculative ones too) or only the tokens committed at the AR step (the paper's tokens)")
    lr: float | None = Field(None, gt=0, description="this method's learning rate (default: train.lr); "
                             "methods are tuned separately, as in any fair comparison")
    uses_ablation_keys: bool = Field(False, description="read top-level k / tau / num_trajectories")


class TrainConfig(_Strict):
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    steps: int = Field(60, ge=1)
    prompts_per_step: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2)
    lr: float = Field(5e-5, gt=0)
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = Field(1.0, gt=0)
    inner_epochs: int = Field(1, ge=1)
    clip_range: float = Field(0.2, gt=0)
    beta_kl: float = Field(0.01, ge=0)
    cfg_consistent: bool = Field(True, description="score with the guided mean; false = authors' code")
    cfg_null_grad: bool = Field(False, description="with cfg_consistent: also back-propagate through the "
                                "null-prompt branch (the exact gradient of the guided mean)")
    loss_ar_steps: int = Field(4, ge=1, description="random AR steps per rollout in the loss")
    loss_head_steps: int = Field(6, ge=1, description="random head steps per AR step in the loss")
    loss_head_window: int = Field(0, ge=0, description="draw the loss head steps from the first N (noisiest) "
                                  "transitions of each chain; 0 = from all of them")
    checkpoint_every: int = Field(10, ge=1)
    grad_probe_every: int = Field(0, ge=0, description="0 = off")
    max_nonfinite_in_row: int = Field(3, ge=1)

    @property
    def cfg_mode(self) -> str:
        """How loss log-probs treat classifier-free guidance (models.chains.guided_output)."""
        if not self.cfg_consistent:
            return "cond"
        return "guided_full" if self.cfg_null_grad else "guided"


class EvaluateConfig(_Strict):
    images_per_prompt: int = Field(4, ge=1)
    seed: int = 1234
    batch_size: int = Field(64, ge=1)
    grid_prompts: int = Field(8, ge=1)


class Params(_Strict):
    k: float = Field(0.3, ge=0, le=1, description="top uncertain token fraction for MTE")
    tau: float = Field(0.0, ge=-1, le=1, description="consistency threshold (cosine)")
    num_trajectories: int = Field(4, ge=1, description="M extra head chains")
    world: WorldConfig = WorldConfig()
    model: ModelConfig = ModelConfig()
    pretrain: PretrainConfig = PretrainConfig()
    sampling: SamplingConfig = SamplingConfig()
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="world", mode="partial")])
    train: TrainConfig = TrainConfig()
    methods: dict[str, MethodConfig] = Field(default_factory=dict)
    evaluate: EvaluateConfig = EvaluateConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> "Params":
        if self.world.image_size % self.model.patch_size:
            raise ValueError(
                f"world.image_size={self.world.image_size} is not divisible by "
                f"model.patch_size={self.model.patch_size}"
            )
        n_tokens = (self.world.image_size // self.model.patch_size) ** 2
        if self.sampling.num_ar_steps > n_tokens:
            raise ValueError(f"sampling.num_ar_steps={self.sampling.num_ar_steps} exceeds the {n_tokens} tokens per image")
        if self.pretrain.decay_steps > self.pretrain.steps:
            raise ValueError(f"pretrain.decay_steps={self.pretrain.decay_steps} exceeds pretrain.steps={self.pretrain.steps}")
        if self.train.loss_ar_steps > self.sampling.num_ar_steps:
            raise ValueError("train.loss_ar_steps exceeds sampling.num_ar_steps")
        if self.train.loss_head_steps > self.sampling.head_steps:
            raise ValueError("train.loss_head_steps exceeds sampling.head_steps")
        window = self.train.loss_head_window
        if window and not self.train.loss_head_steps <= window <= self.sampling.head_steps:
            raise ValueError(
                f"train.loss_head_window={window} must lie between train.loss_head_steps="
                f"{self.train.loss_head_steps} and sampling.head_steps={self.sampling.head_steps} (0 = all steps)"
            )
        return self

    def reward_specs(self) -> list[dict[str, Any]]:
        """rewards as factory kwargs; the world reward gets world.image_size unless set."""
        specs = [r.model_dump() for r in self.rewards]
        for s in specs:
            if s["name"] == "world":
                s.setdefault("image_size", self.world.image_size)
        return specs

    def method(self, name: str) -> "ResolvedMethod":
        if name not in self.methods:
            raise ParamsError(f"unknown method {name!r}; params.yaml methods: {sorted(self.methods)}")
        m = self.methods[name]
        return ResolvedMethod(
            name=name,
            **m.model_dump(exclude={"uses_ablation_keys"}),
            k=self.k if m.uses_ablation_keys else 1.0,
            tau=self.tau if m.uses_ablation_keys else -1.0,
            num_trajectories=self.num_trajectories if m.uses_ablation_keys else 1,
        )


class ResolvedMethod(_Strict):
    name: str
    freeze_head: bool
    estimator: str
    topk: bool
    consistency: bool
    consistency_rule: str
    token_scope: str
    mte_scope: str
    lr: float | None
    k: float
    tau: float
    num_trajectories: int


def _format_errors(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<top level>"
        given = e.get("input")
        if not e["loc"]:  # a cross-field check: its message names the keys
            lines.append(f"  {e['msg'].removeprefix('Value error, ')}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key (remove it or check its spelling)")
        else:
            lines.append(f"  {key}: {e['msg']} (given: {given!r})")
    return "\n".join(lines)


def parse_params(raw: dict[str, Any], source: str = "params.yaml") -> Params:
    try:
        return Params.model_validate(raw or {})
    except ValidationError as err:
        raise ParamsError(f"{source} does not validate:\n{_format_errors(err)}") from None


def load_params(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Params:
    """Read and validate params.yaml. overrides: dotted keys -> values (tests, smoke runs)."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found; run from the repository root or pass --params")
    raw = yaml.safe_load(path.read_text()) or {}
    for dotted, value in (overrides or {}).items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_params(raw, str(path))

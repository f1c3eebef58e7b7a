"""The schemas of params.yaml's sections (world, model, pretrain, sampling, rewards, evaluate,
runtime) and the error helper every section's validator raises; margrpo.config builds
`Params` from them and re-exports them. No torch, no backend import (see margrpo.config).
"""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from margrpo.rewards.table import check_spec

SAMPLERS = ("ddpm", "flow")


def problem(key: str, message: str, fix: str) -> PydanticCustomError:
    """An error located at `key` (relative to the model that raises it; the formatter gives
    its line), with the fix to print."""
    return PydanticCustomError("cross_field", "{message}", {"key": key, "message": message, "fix": fix})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class WorldConfig(Strict):
    image_size: int = Field(32, ge=8, description="pixels; must be divisible by model.patch_size")
    train_prompts_per_tag: int = Field(64, ge=1, description="training prompts per GenEval tag / T2I category "
                                       "(small purposes repeat their few combinations)")
    heldout_prompts_per_tag: int = Field(16, ge=1, description="validation prompts per purpose (model selection "
                                         "during training)")
    test_prompts_per_tag: int = Field(70, ge=1, description="test split: at most this many distinct prompts per "
                                      "purpose (all of a smaller pool); world/prompts.py")
    novel_prompts_per_tag: int = Field(20, ge=0, description="test split: at most this many distinct prompts per "
                                       "purpose that bind a colour to a shape no training prompt binds")
    seed: int = Field(0, description="seed of the prompt splits (stage prepare_prompts)")


class ModelConfig(Strict):
    kind: Literal["tiny", "nova", "harmon"] = Field(
        "tiny", description="tiny: the embedded TinyMAR at model.checkpoint; nova | harmon: the published "
        "model folder at model.weights (docs/models.md)")
    weights: str | None = Field(None, description="nova / harmon: local path of the published model folder")
    checkpoint: str = Field("models/base", description="folder with config.json + safetensors")
    patch_size: int = Field(8, ge=1, description="pixels per side of a token's patch (32 px / 8 = 16 tokens)")
    width: int = Field(192, ge=16, description="AR transformer width")
    depth: int = Field(4, ge=1, description="AR transformer blocks")
    heads: int = Field(4, ge=1, description="attention heads of the AR transformer (must divide width)")
    cond_dim: int = Field(192, ge=8, description="size of the condition z the AR transformer gives the head per token")
    head_width: int = Field(256, ge=16, description="diffusion head width")
    head_depth: int = Field(3, ge=1, description="diffusion head residual blocks (AdaLN)")
    sampler: Literal[SAMPLERS] = Field("flow", description="the head's noise process: ddpm, or flow (a "
                                       "flow-matching SDE with a shifted sigma grid)")
    flow_shift: float = Field(3.0, gt=0, description="flow sampler only: sigma shift (>1 spends more "
                              "training and sampling on high noise, where a token's colour and shape are decided)")
    max_prompt_len: int = Field(16, ge=4, description="prompt words the TinyMAR reads (shorter prompts are padded)")
    # ---- nova / harmon adapters only (docs/models.md)
    image_size: int | None = Field(None, ge=16, description="harmon: generated image size in pixels (None: the "
                                   "authors' 512); nova takes it from its transformer config")
    gradient_checkpointing: bool = Field(True, description="recompute the AR transformer's activations in "
                                         "backward (docs/models.md: what fits on 80 GB with and without)")
    transformer_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="autocast dtype of the AR transformer; head chains and log-probs stay float32")
    llm_dtype: Literal["float32", "bfloat16"] = Field(
        "bfloat16", description="storage dtype of the language model where it is frozen: NOVA's Phi-2 text "
        "encoder, Harmon's Qwen2 under LoRA (trained weights stay float32)")
    lora_rank: int = Field(0, ge=0, description="LoRA rank (peft) on the AR transformer's linear layers; 0 = off")
    lora_alpha: float = Field(16.0, gt=0, description="LoRA scale numerator (scale = alpha / rank)")
    train_text_encoder: bool = Field(False, description="also train the text encoder (frozen by default)")

    @model_validator(mode="after")
    def _adapter_keys(self) -> "ModelConfig":
        if self.kind == "tiny":
            fields = type(self).model_fields
            set_keys = [k for k in ADAPTER_KEYS if getattr(self, k) != fields[k].default]
            if set_keys:
                raise problem(set_keys[0], "applies to model.kind nova or harmon only (model.kind is tiny)",
                               "remove it or set model.kind")
        elif not self.weights:
            raise problem("weights", f"missing: model.kind={self.kind} needs the published {self.kind} folder",
                           "set model.weights to its local path (docs/models.md lists the expected files)")
        if self.kind == "nova" and self.image_size is not None:
            raise problem("image_size", "is fixed by NOVA's transformer config", "remove it for model.kind=nova")
        return self


# ModelConfig keys that only the nova / harmon adapters read: a tiny model refuses any not at its default.
ADAPTER_KEYS = ("weights", "image_size", "gradient_checkpointing", "transformer_dtype", "llm_dtype", "lora_rank",
                "lora_alpha", "train_text_encoder")


class PretrainConfig(Strict):
    steps: int = Field(4000, ge=1, description="optimiser steps")
    batch_size: int = Field(64, ge=1, description="images per step")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate after the warm-up")
    warmup_steps: int = Field(300, ge=1, description="linear LR warm-up steps")
    decay_steps: int = Field(800, ge=0, description="linear LR decay to 0 over the last steps; 0 = none")
    weight_decay: float = Field(0.02, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip")
    ema_decay: float = Field(0.999, ge=0, lt=1, description="decay of the weights' moving average, which is "
                             "the saved model")
    prompt_dropout: float = Field(0.1, ge=0, lt=1, description="probability of training on the null prompt (the "
                                  "unconditional branch of classifier-free guidance)")
    diffusion_batch_mul: int = Field(2, ge=1, description="noise draws per masked token and step")
    seed: int = Field(0, description="seed of the data, mask and noise draws")
    log_every: int = Field(50, ge=1, description="steps between logged losses")
    compile: bool = Field(True, description="torch.compile of encoder and head (in place; the checkpoint is "
                          "unchanged)")


class SamplingConfig(Strict):
    num_ar_steps: int = Field(4, ge=1, description="AR steps per image (MAR's cosine schedule of committed tokens)")
    head_steps: int = Field(20, ge=2, description="diffusion head steps per committed token")
    cfg_scale: float = Field(3.0, ge=0, description="classifier-free guidance scale")
    temperature: float = Field(1.0, gt=0, description="scale of the head's sampling noise")


class RewardSpec(BaseModel):
    # Backend kwargs pass through to the reward factory; names and keys are checked here
    # against margrpo.rewards.table (plain data, no backend import).
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    name: str
    weight: float = 1.0

    @model_validator(mode="after")
    def _known_reward(self) -> "RewardSpec":
        spec = self.model_dump()
        for key, value in spec.items():
            if not finite(value):
                raise problem(key, f"{value!r} is not a finite number", "give it a finite value")
        problems = check_spec(spec)
        if problems:
            key, _, message = problems[0].partition(": ")
            raise problem(key, message, "use one of those (docs/backends.md lists each backend's keys)")
        if self.weight == 0:
            raise problem("weight", "weight 0 turns this reward off", "remove the entry, or give it a weight")
        return self


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return all(map(finite, value))
    if isinstance(value, dict):
        return all(map(finite, value.values()))
    return True


class EvaluateConfig(Strict):
    images_per_prompt: int = Field(2, ge=1, description="images per test prompt and seed (the least any prompt gets)")
    images_per_tag: int = Field(320, ge=0, description="at least this many images per GenEval tag and seed on the "
                                "headline test prompts: a tag with few prompts samples more of each (whole multiples "
                                "of images_per_prompt; world/generate.py allocate_images); 0: images_per_prompt each")
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

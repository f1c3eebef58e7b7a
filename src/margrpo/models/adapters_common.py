"""What the NOVA and Harmon adapters share: the rollout (its AR loop is chains.ar_steps,
the one TinyMAR runs too), the noise source, the parameter groups and the memory knobs.

An adapter subclasses `MARAdapter` and supplies five model-specific pieces:
  prepare_cond(prompts) -> cond     text conditioning for the cond and null branches
  encode_pair(cond, canvas, known)  -> (z_c, z_u), each [B, N, C], one transformer pass
  head_output(x, t, z)              raw head prediction (rows)
  decode_tokens(tokens)             [B, N, D] VAE-latent tokens -> [B, 3, H, W] in [0, 1]
  ar_modules / head_module / text_modules   the parameter groups
and gets `rollout`, `encode` and the parameter groups of `MARPolicy`.

Randomness: every draw of a rollout (token order, head-chain noise) comes from
`self.noise`, a `SeededNoise` that derives it from the image's seed and the AR step with
the counter-based functions TinyMAR uses (models/noise.py). Replacing that one object
(tests, the parity script) changes where the noise comes from and nothing else.
"""
from __future__ import annotations

import contextlib
import re
from typing import Iterator, Sequence

import torch
from torch import nn

from margrpo.models import noise as counter_noise
from margrpo.models.rollout import RolloutMixin

class SeededNoise:
    """Token order and head-chain noise of each image from its seed, counter-based
    (models/noise.py): pure functions of (seed, AR step, slot in the step, head state,
    element), drawn for the whole batch at once; the speculative tokens use their own
    stream, so speculation never changes the image."""

    def order(self, seeds: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """[B, N] long: the commit order of every image, on the seeds' device."""
        return counter_noise.token_order(seeds, num_tokens)

    def step(self, seeds: torch.Tensor, step: int, num_steps: int, n: int, m: int, d: int):
        """Chain noise of AR step `step`: committed [T+1, B, n, D] and speculative
        [T+1, B, m, D] (None when m = 0), addressed by each token's slot in the step."""
        slots = torch.arange(max(n, m), device=seeds.device).expand(len(seeds), -1)  # [B, max(n, m)]
        commit = counter_noise.chain_noise(seeds, step, slots[:, :n], num_steps + 1, d)
        spec = counter_noise.chain_noise(seeds, step, slots[:, :m], num_steps + 1, d, counter_noise.SPECULATIVE) if m else None
        return commit, spec


class MARAdapter(RolloutMixin, nn.Module):
    """Base class of the real-model adapters (see the module docstring)."""

    # Set by subclasses' configure_sampling.
    sampler = None
    schedule: list[int]
    cfg_scale: float
    temperature: float

    def __init__(self):
        super().__init__()
        self.noise = SeededNoise()
        self.train_text_encoder = False
        self.gradient_checkpointing = False
        self.ar_dtype: torch.dtype | None = None  # autocast dtype of the AR transformer

    # ---- to implement ---------------------------------------------------------------
    def prepare_cond(self, prompts: Sequence[str]):
        raise NotImplementedError

    def encode_pair(self, cond, canvas: torch.Tensor, known: torch.Tensor):
        raise NotImplementedError

    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def ar_modules(self) -> list[nn.Module]:
        raise NotImplementedError

    def head_module(self) -> nn.Module:
        raise NotImplementedError

    def text_modules(self) -> list[nn.Module]:
        raise NotImplementedError

    # ---- parameter groups -----------------------------------------------------------
    def text_parameters(self) -> Iterator[nn.Parameter]:
        for m in self.text_modules():
            yield from m.parameters()

    def ar_parameters(self) -> Iterator[nn.Parameter]:
        """The AR transformer's trainable parameters: its LoRA factors when LoRA is on,
        otherwise all of them; plus the text encoder's when it is trained."""
        seen = {id(p) for p in self.head_module().parameters()} | {id(p) for p in self.text_parameters()}
        for m in self.ar_modules():
            for p in m.parameters():
                if id(p) not in seen and p.requires_grad:
                    seen.add(id(p))
                    yield p
        if self.train_text_encoder:
            yield from self.text_parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        return self.head_module().parameters()

    def set_text_trainable(self, trainable: bool) -> None:
        """The text encoder is frozen by default: no gradient, run under no_grad."""
        self.train_text_encoder = trainable
        for p in self.text_parameters():
            p.requires_grad_(trainable)

    def enable_lora(self, rank: int, alpha: float, target_regex: str) -> None:
        """LoRA (peft) on the AR transformer's linear layers matching `target_regex`; the
        base weights are frozen, so ar_parameters() yields the LoRA factors only."""
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError as err:
            raise ImportError("model.lora_rank > 0 needs peft: pip install 'margrpo[lora]'") from err
        if not any(re.fullmatch(target_regex, n) for n, _ in self.named_modules()):
            raise ValueError(f"LoRA target pattern {target_regex!r} matches no module of {type(self).__name__}")
        for m in self.ar_modules():
            m.requires_grad_(False)
        inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_regex), self)
        # peft gives the factors their base layer's dtype; on bfloat16 base weights
        # (model.llm_dtype) AdamW would round their small updates away: keep them float32.
        for name, p in self.named_parameters():
            if "lora_" in name and p.dtype != torch.float32:
                p.data = p.data.float()

    def apply_options(self, *, gradient_checkpointing: bool = False, transformer_dtype: str = "float32",
                      lora_rank: int = 0, lora_alpha: float = 16.0, train_text_encoder: bool = False) -> None:
        """The memory / trainability knobs of params.model (config_sections.py documents them)."""
        self.gradient_checkpointing = gradient_checkpointing
        self.ar_dtype = {"float32": None, "bfloat16": torch.bfloat16}[transformer_dtype]
        self.set_text_trainable(train_text_encoder)
        if lora_rank:
            self.enable_lora(lora_rank, lora_alpha, self.lora_targets)

    @property
    def device(self) -> torch.device:
        """Where the policy computes (its head's device; `place` moves everything together)."""
        return next(self.head_module().parameters()).device

    def set_precision(self, dtype: torch.dtype) -> None:
        """runtime.dtype (models/device.place): bfloat16 runs the AR transformer under bfloat16
        autocast, as model.transformer_dtype does; float32 keeps model.transformer_dtype's
        choice. Head chains, log-probs and the loss stay float32 either way."""
        if dtype != torch.float32:
            self.ar_dtype = dtype

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The state a fine-tuned policy changes: everything but the frozen text encoder
        and the VAE (what `save_pretrained` writes on top of the published weights)."""
        skip = [self.vae] + ([] if self.train_text_encoder else self.text_modules())
        prefixes = tuple(f"{name}." for name, m in self.named_modules() if any(m is s for s in skip))
        return {k: v for k, v in self.state_dict().items() if not k.startswith(prefixes)}

    def save_pretrained(self, path, weights: str | None = None) -> None:
        """Write the trainable state as adapter_state.safetensors (+ adapter.json naming
        the published folder it applies to); `margrpo.models.loading.load_model` reads it."""
        import json
        from pathlib import Path

        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.trainable_state().items()}
        save_file(state, str(path / "adapter_state.safetensors"))
        (path / "adapter.json").write_text(json.dumps({"class": type(self).__name__, "weights": weights}, indent=1))

    def ar_context(self):
        """Autocast context of the AR transformer (bf16 when model.transformer_dtype says so)."""
        if self.ar_dtype is None or self.ar_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.ar_dtype)

    def run_block(self, block: nn.Module, *args):
        """One transformer block, recomputed in backward when gradient checkpointing is on."""
        if self.gradient_checkpointing and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
        return block(*args)

    # ---- MARPolicy ------------------------------------------------------------------
    @property
    def consistency_reference(self) -> float:
        """0.0: NOVA's and Harmon's tokens are VAE latents (scaled to roughly zero mean and unit
        variance), so the plain cosine already compares content, as the paper's rule does
        (MARPolicy.consistency_reference)."""
        return 0.0

    @property
    def num_ar_steps(self) -> int:
        return len(self.schedule)

    def token_order(self, seeds: torch.Tensor) -> torch.Tensor:
        """[B, N] on the policy's device: the rollout builds its canvas where the order is."""
        return self.noise.order(seeds.to(self.device), self.num_tokens)

    def step_noise(self, seeds: torch.Tensor, i: int, idx: torch.Tensor, rest: torch.Tensor | None):
        m = 0 if rest is None else rest.shape[1]
        return self.noise.step(seeds, i, self.sampler.num_steps, idx.shape[1], m, self.token_dim)


def known_rows(known: torch.Tensor) -> torch.Tensor:
    """[B, N] bool with the same count k per row -> [B, k] positions, ascending."""
    b = known.shape[0]
    k = int(known[0].sum())
    if not bool((known.sum(1) == k).all()):
        raise ValueError("every image of a batch must have the same number of known tokens")
    return known.nonzero(as_tuple=True)[1].view(b, k)


def parameter_manifest(module: nn.Module) -> dict[str, list[int]]:
    """Name -> shape of every tensor in the state dict (parameters and persistent buffers),
    the layout a published checkpoint must match."""
    return {k: list(v.shape) for k, v in module.state_dict().items()}

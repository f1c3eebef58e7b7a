"""Pretraining of the tiny MAR on a data source the caller passes (the embedded study: the
synthetic world, margrpo.world.data.WorldBatches).

The data source has `sample(batch_size, generator) -> (images [B, 3, H, W] in [0, 1],
prompts [B])`. Data and masking draw from one torch.Generator seeded with pretrain.seed, so
a run is a pure function of its config and seed. Sampling uses an EMA copy of the weights
(standard MAR practice; the raw weights give blotchier samples).

Training runs on the model's device (margrpo.models.device.place): the data and every
random draw stay on the CPU generator and are moved, so CPU and CUDA runs see the same
batches, masks and noise (their float kernels still round differently).
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Protocol

import torch
from tqdm.auto import tqdm

from margrpo.config import PretrainConfig
from margrpo.models.mar import TinyMAR


class PretrainData(Protocol):
    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, list[str]]: ...


def lr_at(step: int, s: PretrainConfig) -> float:
    """Warmup-stable-decay: linear warmup, constant, then a linear decay to 0 over the last
    `decay_steps` (0: no decay). Up to the decay, a run stopped at step S equals a longer one's
    first S steps, so the decay phase can be rerun from the stable part."""
    warm = min(1.0, (step + 1) / s.warmup_steps)
    left = s.steps - step
    return s.lr * min(warm, left / s.decay_steps if s.decay_steps else 1.0)


def pretrain(
    model: TinyMAR,
    s: PretrainConfig,
    data: PretrainData,
    on_log: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
    on_checkpoint: Callable[[int, TinyMAR], None] | None = None,
    checkpoint_every: int = 1000,
) -> TinyMAR:
    """Train `model` in place (on its device) for s.steps on batches of `data`; returns the
    EMA model (eval mode)."""
    dev = model.device
    gen = torch.Generator().manual_seed(s.seed)
    torch.manual_seed(s.seed)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    decay_params = [p for n, p in model.named_parameters() if p.ndim >= 2]
    other_params = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay_params, "weight_decay": s.weight_decay}, {"params": other_params, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
    )
    if s.compile:
        # In place (nn.Module.compile), so parameter names, the EMA copy made above and the
        # saved checkpoint are unchanged. The head sees a different number of masked rows
        # every step, hence dynamic shapes. Costs ~70 s of compilation once, then ~20% less
        # time per step on 2 cores (the step is matmul-bound; the gain is fused elementwise ops).
        model.encoder.compile()
        model.head.compile(dynamic=True)
    model.train()
    t0, running = time.time(), 0.0
    bar = tqdm(range(s.steps), desc="pretrain", disable=not progress, mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, s)
        images, prompts = data.sample(s.batch_size, gen)
        loss = model.training_loss(
            images.to(dev), model.tokenize(prompts).to(dev), gen, s.prompt_dropout, s.diffusion_batch_mul
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        # EMA warm-up as in common practice: effective decay min(decay, (1+step)/(10+step)).
        d = min(s.ema_decay, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1.0 - d)
        running += loss.item()
        if (step + 1) % s.log_every == 0:
            metrics = {
                "pretrain/loss": running / s.log_every,
                "pretrain/grad_norm": float(grad_norm),
                "pretrain/lr": lr_at(step, s),
                "time/elapsed_s": time.time() - t0,
            }
            running = 0.0
            bar.set_postfix(loss=f"{metrics['pretrain/loss']:.4f}")
            if on_log is not None:
                on_log(step + 1, metrics)
        if on_checkpoint is not None and (step + 1) % checkpoint_every == 0:
            on_checkpoint(step + 1, ema)
    return ema

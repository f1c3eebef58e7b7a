"""Gradient-variance probe: two independent gradient estimates of the same loss.

Signal-to-noise of the policy gradient (`group_halves`): split a batch by GROUPS (prompts)
into two halves; each half is an independent, unbiased estimate of the expected gradient
(its advantages are normalised within its own groups), so g_a . g_b estimates |E g|^2 and
|g_a - g_b|^2 / 2 the noise of one half-batch. Splitting WITHIN groups is not independent:
the advantages of a group sum to zero, so a direction common to all its images enters the
two halves with opposite signs and drags the cosine below zero even where there is signal.

The MTE estimators draw random chains; with the rollout fixed, two independent draws
g1, g2 of the loss gradient (different generator seeds, same parameters) measure the noise
the draws add:
- cosine(g1, g2): near 1 when the draws barely matter, near 0 when noise dominates;
- noise_var = |g1 - g2|^2 / 2: unbiased estimate of trace Cov(g) (for independent draws);
- signal = g1 . g2: unbiased estimate of |E g|^2 (may be negative when noise dominates);
- noise_to_signal = noise_var / |mean|^2 with mean = (g1 + g2) / 2;
- snr = signal / noise_var: |E g|^2 over the noise of one estimate (unbiased numerator and
  denominator; averaged over batches it says how many batches an update needs before it
  follows the reward rather than the noise: about 1 / snr).
Comparing noise_var of two estimators (`variance_ratio`) gives their variance ratio.

`params_grad` and `two_estimates` take gradients with torch.autograd.grad, so parameters'
.grad fields are untouched. `probe_gradients` is the trainer's probe (probe/* metrics): it
recomputes the trainer's gradient on variants of one batch and empties .grad at the end.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

from margrpo.method.plan import TokenPlan, plan_tokens


def flat_grad(grads: Sequence[torch.Tensor | None], params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate gradients into one float64 vector [P]; None (unused parameter) -> zeros.
    For small models and tests: the trainer's probe keeps gradients per parameter (`pair_stats`)."""
    parts = [
        (torch.zeros_like(p) if g is None else g).reshape(-1).double()
        for g, p in zip(grads, params)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.float64)


def params_grad(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """Flat gradient [P] of a scalar loss w.r.t. params (no .grad side effects)."""
    grads = torch.autograd.grad(loss, list(params), allow_unused=True)
    return flat_grad(grads, params)


Grad = torch.Tensor | Sequence[torch.Tensor]  # a flat vector, or one tensor per parameter


def pair_stats(g1: Grad, g2: Grad) -> dict[str, float]:
    """Statistics of two independent estimates of one gradient (module docstring).

    g1, g2: flat vectors [P], or per-parameter tensors in the same order (a model's
    gradients as they are: no flat copy). Sums in float64, one parameter at a time; the
    six numbers are read from the device in one host sync."""
    a_parts = [g1] if isinstance(g1, torch.Tensor) else list(g1)
    b_parts = [g2] if isinstance(g2, torch.Tensor) else list(g2)
    if len(a_parts) != len(b_parts):
        raise ValueError(f"the two gradients have {len(a_parts)} and {len(b_parts)} parts")
    acc = None  # float64 [dot, |g1|^2, |g2|^2, |g1 - g2|^2, |(g1 + g2) / 2|^2]
    for a, b in zip(a_parts, b_parts):
        a, b = a.reshape(-1).double(), b.reshape(-1).double()
        part = torch.stack([a @ b, a @ a, b @ b, (a - b).pow(2).sum(), (0.5 * (a + b)).pow(2).sum()])
        acc = part if acc is None else acc + part
    dot, n1, n2, diff_sq, mean_sq = acc.tolist() if acc is not None else [0.0] * 5
    noise_var = 0.5 * diff_sq
    return {
        "cosine": dot / math.sqrt(n1 * n2) if n1 > 0 and n2 > 0 else 0.0,
        "noise_var": noise_var,
        "signal": dot,
        "mean_norm": math.sqrt(mean_sq),
        "noise_to_signal": noise_var / mean_sq if mean_sq > 0 else float("inf"),
        "snr": dot / noise_var if noise_var > 0 else 0.0,
    }


def group_halves(groups: torch.Tensor, num_groups: int | None = None) -> torch.Tensor:
    """[B] bool: True for the images of the first half of the groups (by sorted group id).
    groups: [B] group index of every image; num_groups: the groups are 0..num_groups-1 of a
    global batch that `groups` may be one rank's block of (default: the groups present).
    Needs at least two groups."""
    ids = groups.unique() if num_groups is None else torch.arange(num_groups, device=groups.device)
    if ids.numel() < 2:
        raise ValueError("the signal-to-noise probe splits the batch by groups and needs at least two "
                         "prompts per step (train.prompts_per_step >= 2)")
    return torch.isin(groups, ids[: ids.numel() // 2])


def variance_ratio(stats_a: dict[str, float], stats_b: dict[str, float]) -> float:
    """noise_var of estimator a over that of estimator b (< 1: a is less noisy)."""
    return stats_a["noise_var"] / stats_b["noise_var"] if stats_b["noise_var"] > 0 else float("inf")


def two_estimates(
    loss_fn: Callable[[torch.Generator], torch.Tensor],
    params: Sequence[torch.Tensor],
    seeds: tuple[int, int] = (0, 1),
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Two gradient estimates [P] of loss_fn from independently seeded generators, and
    their `pair_stats`. loss_fn(generator) must take ALL its random draws (e.g. the MTE
    chains) from the generator it is given, so the two estimates differ only by them."""
    if seeds[0] == seeds[1]:
        raise ValueError("the two estimates need different seeds")
    params = list(params)
    grads = [params_grad(loss_fn(torch.Generator().manual_seed(int(s))), params) for s in seeds]
    return grads[0], grads[1], pair_stats(grads[0], grads[1])


def probe_gradients(trainer, batch) -> dict[str, float]:
    """Gradient signal-to-noise of the transformer on one training batch before its update.

    trainer: a training.trainer.Trainer; batch: its Batch, collected and not yet updated on.
    Every gradient is trainer.compute_grads on the same rollout (collective over ranks);
    variant plans come from plan_tokens, whose draws are keyed by the image seeds, so no
    generator moves, and .grad is emptied at the end: the update that follows is the one
    without the probe.

    - probe/snr, probe/cos_groups, probe/signal, probe/noise: the two halves of the GROUPS
      (prompts), each an independent unbiased estimate; snr = g_a . g_b / (|g_a - g_b|^2 / 2).
    - probe/cos_draws (MTE estimators): cosine of two gradients from independent chain draws.
    - probe/var_ratio_vs_single (MTE estimators): this method's half-batch noise over that
      of the `single` estimator on the same rollout and tokens (< 1: less noise).
    - probe/snr_committed (committed+speculative scope): the same snr with the committed
      tokens alone; probe/snr_unfiltered (with the consistency filter): with every
      speculative token. The same rollouts, so the three differ only in the loss tokens.
    """
    method, ar, scorer = trainer.method, trainer.ar_params, trainer.scorer(batch.rollout)
    half = group_halves(batch.groups, trainer.tcfg.prompts_per_step)  # halves of the global groups
    ar_steps, head_steps = [p.index for p in batch.plans], [p.head_steps for p in batch.plans]

    def grad_of(weight=None, plans=None) -> list[torch.Tensor]:
        # The .grad tensors themselves, not a copy: compute_grads empties .grad (set to None)
        # before its backward, so the next call writes new tensors and these stay as they are.
        trainer.compute_grads(batch, weight, plans)
        return [torch.zeros_like(p) if p.grad is None else p.grad for p in ar]

    def replan(variant, draw: int = 0) -> list[TokenPlan]:
        return plan_tokens(scorer, batch.rollout, ar_steps, head_steps, variant, draw=draw)

    halves = pair_stats(grad_of(half), grad_of(~half))
    out = {"probe/snr": halves["snr"], "probe/cos_groups": halves["cosine"],
           "probe/signal": halves["signal"], "probe/noise": halves["noise_var"]}
    if method.estimator != "single":
        # draw 1: the same images' chains on independent streams (the batch used draw 0)
        out["probe/cos_draws"] = pair_stats(grad_of(), grad_of(plans=replan(method, draw=1)))["cosine"]
        sp = replan(method.model_copy(update={"estimator": "single", "topk": False}))
        out["probe/var_ratio_vs_single"] = variance_ratio(halves, pair_stats(grad_of(half, sp), grad_of(~half, sp)))
    if method.token_scope == "committed+speculative":
        variants = {"probe/snr_committed": [dataclasses.replace(p, mask=p.committed_mask) for p in batch.plans]}
        if method.consistency:
            variants["probe/snr_unfiltered"] = replan(method.model_copy(update={"consistency": False}))
        for key, plans in variants.items():
            out[key] = pair_stats(grad_of(half, plans), grad_of(~half, plans))["snr"]
    trainer.opt.zero_grad(set_to_none=True)
    return out

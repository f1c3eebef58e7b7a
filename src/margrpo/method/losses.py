"""The terms of the GRPO loss and how they add up (method.md §2, §3.2). Pure tensor functions.

Aggregation rule (the same for every estimator and token scope, so methods compare):

1. Per chain s, head step j, token n, the PPO term is w_s * (-min(ratio A, clip(ratio) A)),
   w_s the chain weight of the estimator (1 for `single`, 1/M for `resample` / `elbo`,
   importance weights for `posterior`); the weights of one token sum to 1.
2. One term per scored transition (AR step i, head step j, image b, token n): the term of
   the token's own rollout chain, or, for a token with a multi-trajectory estimate, the sum
   of its chain terms, the weighted chain average (`token_terms` places both).
3. The loss is the SUM of those terms over every scored transition of every image
   (`transition_sum` gives the per-image sums of one AR step), divided by one constant
   (Trainer.compute_grads sizes and applies it).

Every scored transition therefore weighs the same, as in the policy gradient of the
expected reward (sum over actions of A * score): a token committed at a step with two
tokens weighs what one committed at a step with six does, and a speculative token that
enters the loss adds terms on top of the committed ones instead of diluting them. A
constant divisor also makes the gradient of a batch split over several workers the sum of
their gradients, which is what an all-reduce computes.

The KL term (`gaussian_kl`, to the frozen reference, on the rollout chain of every loss
token) goes through the same rule with weight 1.
"""
from __future__ import annotations

from typing import Sequence

import torch

# KL(N(mean, std^2 I) || N(mean_ref, std^2 I)) per transition: [..., D] means, [...] std -> [...].
from margrpo.models.samplers import gaussian_kl_same_std as gaussian_kl  # noqa: F401  (re-exported)


def ppo_clipped_term(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    clip_range: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-element clipped surrogate loss -min(ratio A, clip(ratio, 1-c, 1+c) A) [* weight].

    logp_new, logp_old: [...] log-probs of the same actions (transitions); adv and weight
    broadcast to that shape. logp_old and weight are treated as constants (detached).
    At theta_old (ratio == 1) the gradient of the sum is -sum(weight * A * dlogp_new).
    """
    ratio = torch.exp(logp_new.float() - logp_old.detach().float())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = loss * weight.detach()
    return loss


@torch.no_grad()
def ratio_stats(logp_new: torch.Tensor, logp_old: torch.Tensor, clip_range: float) -> dict[str, torch.Tensor]:
    """How far the policy moved on some transitions [...], as scalar tensors: clipfrac, the
    fraction with |ratio - 1| > c; approx_kl = mean((ratio - 1) - log ratio), the
    non-negative low-variance estimator of KL(old || new) used in PPO implementations;
    ratio_mean, ratio_max."""
    log_ratio = logp_new.float() - logp_old.float()
    ratio = torch.exp(log_ratio)
    return {"clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean(),
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(), "ratio_mean": ratio.mean(), "ratio_max": ratio.max()}


def token_terms(own: torch.Tensor, single: torch.Tensor,
                pieces: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> torch.Tensor:
    """The per-transition terms [S, B, L] of one AR step (aggregation rule, step 2).

    own: [S, B, L] the terms of every token's own rollout chain; single: [B, L] bool, the
    tokens scored by it (elsewhere own is replaced, without gradient, by 0); pieces: (rows
    [R] long, flat index into B * L; terms [S, R]) of the tokens scored by other chains
    (multi-trajectory estimates), placed over the rest. Dense and masked rather than
    gathered, so that placing the tokens reads no index from the device.
    """
    s, b, n = own.shape
    out = torch.where(single.unsqueeze(0), own, torch.zeros((), dtype=own.dtype, device=own.device)).view(s, b * n)
    for rows, terms in pieces:
        out = out.index_copy(1, rows, terms.to(out.dtype))
    return out.view(s, b, n)


def transition_sum(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-image sum of one AR step's terms over head steps and loss tokens (rule step 3).

    terms: [S, B, L] per (head step, image, token); mask: [B, L] bool loss tokens.
    Returns [B]. Masked-out tokens contribute exactly 0 (and no gradient).
    """
    return (terms * mask.to(terms.dtype)).sum(dim=(0, 2))

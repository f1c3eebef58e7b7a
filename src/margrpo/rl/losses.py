"""Policy-gradient terms of the GRPO loss and how they add up (method.md §2, §3.2).

Aggregation rule (the same for every estimator and token scope, so methods compare):

1. Per chain s, head step j, token n, the PPO term is w_s * (-min(ratio A, clip(ratio) A)),
   w_s the chain weight of the estimator (1 for `single`, 1/M for `resample` / `elbo`,
   importance weights for `posterior`); the weights of one token sum to 1.
2. The chain terms of a token are SUMMED over its chains (`merge_chain_terms`): one term per
   scored transition (AR step i, head step j, image b, token n), the weighted chain average.
3. The loss is the SUM of those terms over every scored transition of every image, divided
   by a constant: (images in the global batch) x (transition slots per image), the slots
   being the committed tokens of the loss AR steps times the loss head steps
   (`transition_sum` does the per-image sums; the trainer divides).

Every scored transition therefore weighs the same, as in the policy gradient of the
expected reward (sum over actions of A * score). The earlier rule (mean over the tokens of
each AR step, then over (AR step, image) pairs) gave a token committed at a step with two
tokens three times the weight of one at a step with six. A speculative token that enters
the loss adds terms on top of the committed ones; it does not dilute them. A constant
normaliser also makes the gradient of a batch split over several workers the sum of their
gradients, which is what an all-reduce computes.

The KL term goes through the same rule with weight 1.
"""
from __future__ import annotations

import torch


def ppo_clipped_term(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    adv: torch.Tensor,
    clip_range: float,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-element clipped surrogate loss -min(ratio A, clip(ratio, 1-c, 1+c) A) [* weight].

    logp_new, logp_old: [...] log-probs of the same actions (transitions); adv and weight
    broadcast to that shape. logp_old and weight are treated as constants (detached).
    At theta_old (ratio == 1) the gradient of the sum is -sum(weight * A * dlogp_new).

    Returns (loss_elems [...], stats) with detached scalar stats over all elements:
    clipfrac = fraction with |ratio - 1| > c; approx_kl = mean((ratio - 1) - log ratio),
    the non-negative low-variance estimator of KL(old || new) used in PPO implementations;
    ratio_mean, ratio_max.
    """
    log_ratio = logp_new.float() - logp_old.detach().float()
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range) * adv
    loss = -torch.minimum(unclipped, clipped)
    if weight is not None:
        loss = loss * weight.detach()
    with torch.no_grad():
        stats = {
            "clipfrac": ((ratio - 1.0).abs() > clip_range).float().mean(),
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "ratio_mean": ratio.mean(),
            "ratio_max": ratio.max(),
        }
    return loss, stats


def merge_chain_terms(
    single_terms: torch.Tensor, chain_terms: torch.Tensor, rows: torch.Tensor
) -> torch.Tensor:
    """Put the weighted multi-chain terms of the selected tokens in place of the
    single-chain terms (aggregation rule, step 2).

    single_terms: [S, B, n] terms of the rollout chain for every token.
    chain_terms: [S, M, R] per-chain terms, already multiplied by their weights.
    rows: [R] long, flat index into B * n of the tokens the chains belong to.
    Returns [S, B, n]: sum over chains at `rows`, the single term elsewhere.
    """
    s, b, n = single_terms.shape
    flat = single_terms.reshape(s, b * n)
    merged = flat.index_copy(1, rows, chain_terms.sum(1).to(flat.dtype))
    return merged.reshape(s, b, n)


def transition_sum(terms: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-image sum of one AR step's terms over head steps and loss tokens (rule step 3).

    terms: [S, B, n] per (head step, image, token); mask: [B, n] bool loss tokens.
    Returns [B]. Masked-out tokens contribute exactly 0 (and no gradient).
    """
    return (terms * mask.to(terms.dtype)).sum(dim=(0, 2))

"""Policy-gradient, KL and aggregation terms of the GRPO loss (method.md §2, §3.2).

Aggregation rule (the same for every estimator, so `single` and the MTE estimators are
comparable; `aggregate` implements it):

1. Per chain, per head step j, per token n, the PPO term is
   w_s * (-min(ratio A, clip(ratio) A)), w_s the chain weight of the estimator
   (1 for `single`, 1/M for `resample` / `elbo`, self-normalised importance weights for
   `posterior`). The weights of one token sum to 1.
2. The chain terms of a token are SUMMED over its chains (`merge_chain_terms`), which gives
   one term per (AR step i, head step j, image b, token n): the weighted average over
   chains. A token therefore weighs the same whatever the number of chains.
3. For each AR step i, image b and head step j: MEAN over the tokens of image b selected
   for the loss at step i (the loss-token mask).
4. MEAN over the head steps in the loss, then MEAN over all (AR step, image) pairs that
   have at least one selected token. Pairs with no selected token are left out, not
   counted as zero, so an image does not lose weight because a filter emptied one step.

The KL term (and any other per-token term) goes through the same rule with weight 1.
"""
from __future__ import annotations

from typing import Sequence

import torch

from margrpo.models.samplers import gaussian_kl_same_std


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


def gaussian_kl(mean_theta: torch.Tensor, mean_ref: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Exact KL(N(mean_theta, std^2 I) || N(mean_ref, std^2 I)) per token: [..., D] -> [...].

    Both policies share the sampler's std, so the KL is |mean diff|^2 / (2 std^2)
    (not the exp(d) - d - 1 of the authors' code, method.md §5).
    """
    return gaussian_kl_same_std(mean_theta, mean_ref, std)


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


def token_mean(terms: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rule steps 3-4 for one AR step: terms [S, B, n], mask [B, n] bool.

    Returns (per-image value [B], valid [B] bool): masked mean over tokens, then mean over
    the S head steps; valid is False (and the value 0) for images with no selected token.
    """
    m = mask.to(terms.dtype)
    count = m.sum(-1)  # [B]
    per_step = (terms * m).sum(-1) / count.clamp_min(1.0)  # [S, B]
    return per_step.mean(0), count > 0


def aggregate(terms: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """The scalar loss from per-AR-step terms (module docstring, steps 3-4).

    terms[i]: [S, B, n_i] per (head step, image, token) terms of AR step i (chains already
    merged); masks[i]: [B, n_i] bool loss-token mask. n_i and S may differ between steps.
    Returns the mean over valid (AR step, image) pairs of the per-image values; 0 (with
    gradient graph intact) if nothing is selected anywhere.
    """
    if len(terms) != len(masks) or not terms:
        raise ValueError("need one mask per AR step and at least one step")
    values, valids = zip(*(token_mean(t, m) for t, m in zip(terms, masks)))
    v, ok = torch.stack(values), torch.stack(valids).to(values[0].dtype)  # [K, B]
    return (v * ok).sum() / ok.sum().clamp_min(1.0)

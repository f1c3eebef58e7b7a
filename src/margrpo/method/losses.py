"""The GRPO loss of one AR step and its terms (method.md §2, §3.2). Pure tensor functions.

`step_loss` is the loss of one AR step from the log-probs the trainer scored
(`StepScores`): the PPO clipped term of every loss token's own rollout chain, the weighted
chain terms of the tokens with a multi-trajectory estimate (`chain_policy_terms`), their
placement (`token_terms`), the KL to the reference, and the ratio statistics.

Aggregation rule (the same for every estimator and token scope, so methods compare):

1. Per chain s, head step j, token n, the PPO term is w_s * (-min(ratio A, clip(ratio) A)),
   w_s the chain weight of the estimator (1 for `single`, 1/M for `resample` / `elbo`,
   importance weights for `posterior`); the weights of one token sum to 1.
2. One term per scored transition (AR step i, head step j, image b, token n): the term of
   the token's own rollout chain, or, for a token with a multi-trajectory estimate, the sum
   of its chain terms, the weighted chain average (`token_terms` places both).
3. The loss is the SUM of those terms over every scored transition of every image
   (`transition_sum` gives the per-image sums of one AR step), divided by one constant
   (the trainer sizes it; `step_loss` applies it).

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

from typing import TYPE_CHECKING, NamedTuple, Sequence

import torch

# KL(N(mean, std^2 I) || N(mean_ref, std^2 I)) per transition: [..., D] means, [...] std -> [...].
from margrpo.models.samplers import gaussian_kl_same_std as gaussian_kl

if TYPE_CHECKING:
    from margrpo.method.estimators import ChainDraw
    from margrpo.method.plan import TokenPlan


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


def chain_policy_terms(
    draw: "ChainDraw",
    logp_new: torch.Tensor,
    adv: torch.Tensor,
    clip_range: float,
    n_tokens: int,
    head_steps: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted PPO terms of the chains and how far the policy moved on them:
    (terms [S, M, R], ratio_stats of the chains' transitions).

    logp_new: [S, M, R] current log-probs of draw.states at the head steps `head_steps`
    (long [S]; default all T). adv: [B] image advantages; n_tokens: n, tokens per image of
    this AR step, to map rows to images (row // n).
    """
    if draw.logp_steps is not None:
        if head_steps is None or not torch.equal(head_steps, draw.logp_steps):
            raise ValueError("this draw holds logp_old at its logp_steps only; score it at exactly those head steps")
        old = draw.logp_old
    else:
        old = draw.logp_old if head_steps is None else draw.logp_old[head_steps]
    a = adv[draw.rows // n_tokens].view(1, 1, -1)
    terms = ppo_clipped_term(logp_new, old, a, clip_range, weight=draw.weights.unsqueeze(0))
    return terms, ratio_stats(logp_new, old, clip_range)


class StepScores(NamedTuple):
    """What the loss of one AR step reads from the models, scored at the current parameters
    (Trainer.score_step), in the plan's layout: one entry per plan block (committed, then
    speculative), S loss head steps, B images, g tokens of the block."""

    logp: list[torch.Tensor]  # per block [S, B, g] log-probs of the rollout chains (with grad)
    mean: list[torch.Tensor]  # per block [S, B, g, D] the policy's Gaussian means (with grad)
    std: list[torch.Tensor]  # per block [S, B, g] their std (the sampler's, no parameter)
    ref_mean: list[torch.Tensor] | None  # per block [S, B, g, D] the reference's means; None: no KL
    chain_logp: torch.Tensor | None  # [S, M, R] log-probs of the plan's multi-trajectory chains


class StepLoss(NamedTuple):
    """`step_loss`'s result: the loss to backpropagate and its parts, read later."""

    loss: torch.Tensor  # scalar, with grad: policy + beta_kl * kl
    policy: torch.Tensor  # scalar, detached: the PPO part
    kl: torch.Tensor | None  # scalar, detached: the KL part (None without a reference)
    moved: list[dict[str, torch.Tensor]]  # ratio_stats per scored chain set, blocks first


def step_loss(plan: "TokenPlan", scores: StepScores, adv: torch.Tensor, image_weight: torch.Tensor,
              normaliser: float, clip_range: float, beta_kl: float) -> StepLoss:
    """The loss of one AR step (aggregation rule above):

        sum over head steps j, images b, loss tokens n of
            image_weight_b * (PPO term + beta_kl * KL)[j, b, n] / normaliser

    plan: the step's TokenPlan (layout, loss-token mask, chains, old log-probs); adv: [B]
    advantages; image_weight: [B] the images in the loss (1, or the gradient probe's 0/1
    halves). A token in plan.draw is scored by the weighted sum over its M chains, every
    other loss token by its own rollout chain."""
    b, width = plan.mask.shape  # B images x L layout tokens of the step
    old = [blk.logp[plan.head_steps] for blk in plan.blocks]  # per block [S, B, g]
    moved = [ratio_stats(lp, o, clip_range) for lp, o in zip(scores.logp, old)]
    own = ppo_clipped_term(torch.cat(scores.logp, dim=2), torch.cat(old, dim=2), adv.view(1, b, 1), clip_range)
    pieces, d = [], plan.draw
    if scores.chain_logp is not None:
        chain_terms, chain_moved = chain_policy_terms(d, scores.chain_logp, adv, clip_range, width, plan.head_steps)
        pieces.append((d.rows, chain_terms.sum(1)))  # [S, R]: a token's chain terms add up to its term
        moved.append(chain_moved)
    pg = (transition_sum(token_terms(own, plan.single, pieces), plan.mask) * image_weight).sum() / normaliser
    if scores.ref_mean is None:
        return StepLoss(pg, pg.detach(), None, moved)
    kl_terms = [gaussian_kl(m, r, s) for m, r, s in zip(scores.mean, scores.ref_mean, scores.std)]  # [S, B, g]
    kl = (transition_sum(torch.cat(kl_terms, dim=2), plan.mask) * image_weight).sum() / normaliser
    return StepLoss(pg + beta_kl * kl, pg.detach(), kl.detach(), moved)

"""Token selection for the loss: uncertainty top-k (method.md §3.2) and consistency (§3.3).

Shapes: B images, N (or n) tokens per image, D token dim, M extra head chains.
All masks are bool tensors; all functions are pure and gradient-free.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from margrpo.config import CONSISTENCY_RULES


def uncertainty_map(final_tokens: torch.Tensor) -> torch.Tensor:
    """Variance across the M chains of their final tokens, averaged over D: [M, B, n, D] -> [B, n].

    Population variance (divide by M): only the ranking matters for top-k, and M = 1 then
    gives 0 instead of NaN.
    """
    return final_tokens.float().var(dim=0, correction=0).mean(-1)


def topk_count(k: float, n: int) -> int:
    """ceil(k * n), robust to float noise (k = 0.3, n = 10 gives 3, not 4)."""
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"k must be in [0, 1], got {k}")
    return min(n, math.ceil(round(k * n, 9)))


def topk_mask(uncertainty: torch.Tensor, k: float, candidates: torch.Tensor | None = None) -> torch.Tensor:
    """Select the ceil(k * n_b) most uncertain tokens of each image: [B, n] -> bool [B, n].

    candidates: optional bool [B, n]; only those tokens compete and n_b is their count per
    image (default: all n). Ties are broken deterministically by the lower token index
    (stable sort). k = 0 selects none, k = 1 selects all candidates.
    """
    b, n = uncertainty.shape
    if candidates is None:
        candidates = torch.ones(b, n, dtype=torch.bool, device=uncertainty.device)
    u = torch.where(candidates, uncertainty.float(), torch.full_like(uncertainty, -math.inf, dtype=torch.float32))
    order = torch.sort(u, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=u.device).expand(b, n))
    # ceil(k n_b) for every possible count n_b, looked up on the device (no per-image sync)
    table = torch.tensor([topk_count(k, c) for c in range(n + 1)], device=u.device)
    counts = table[candidates.sum(-1)]
    return (rank < counts.unsqueeze(-1)) & candidates


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity over the last dim, [B, N, D] x2 -> [B, N]; 0 for a zero vector."""
    return F.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)


def consistency_keep(
    spec_i: torch.Tensor,
    final: torch.Tensor,
    tau: float,
    rule: str,
    committed: torch.Tensor,
    spec_prev: torch.Tensor | None = None,
) -> torch.Tensor:
    """Which tokens pass the consistency filter at AR step i: bool [B, N].

    spec_i, spec_prev: [B, N, D] speculative predictions of steps i and i-1; final: [B, N, D]
    the finally committed tokens; committed: bool [B, N] tokens committed at step i, always
    kept (their own chain produced the final token).
    - rule "paper": keep if cos(xhat_i, x_fin) > tau.
    - rule "code" (authors' code): keep if cos(xhat_i, x_fin) - cos(xhat_{i-1}, x_fin) > tau.
      At step 0 there is no previous prediction (spec_prev=None); we measure the improvement
      against an uninformed prediction, cos = 0, so step 0 falls back to cos(xhat_0, x_fin) > tau.
    """
    if rule not in CONSISTENCY_RULES:
        raise ValueError(f"rule must be one of {CONSISTENCY_RULES}, got {rule!r}")
    score = _cos(spec_i, final)
    if rule == "code" and spec_prev is not None:
        score = score - _cos(spec_prev, final)
    return (score > tau) | committed


def loss_token_mask(
    committed: torch.Tensor,
    keep: torch.Tensor,
    scope: str,
    known: torch.Tensor | None = None,
) -> torch.Tensor:
    """Tokens entering the loss of one AR step: bool [B, N].

    scope "committed": the tokens committed at this step only.
    scope "committed+speculative": plus the still-masked tokens that pass `keep` (the
    authors' NOVA code). known: bool [B, N] tokens committed BEFORE this step; they are never
    speculative (their "prediction" is the canvas itself, which would trivially pass the
    consistency filter), so they are excluded when given.
    """
    if scope == "committed":
        return committed.clone()
    if scope == "committed+speculative":
        spec = keep & ~committed
        if known is not None:
            spec = spec & ~known
        return committed | spec
    raise ValueError(f"scope must be 'committed' or 'committed+speculative', got {scope!r}")

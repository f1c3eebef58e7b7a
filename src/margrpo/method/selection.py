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


def uncertainty_topk(finals: list[torch.Tensor | None], sources: list[torch.Tensor], candidates: list[torch.Tensor],
                     k: float, pool: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Top-k selection of the loss AR steps by the uncertainty of M head chains per token:
    (uncertainty maps [B, L] per step, 0 outside the candidates; selected [B, L] per step).

    finals: per step the chains' final tokens [M, X, D] (None: no chains, uncertainty 0);
    sources: per step [B * L] long, the row of `finals` that holds layout token r (read only
    where it is a candidate); candidates: per step [B, L] bool. pool "ar_step" ranks within
    each step (ceil(k n_i) per image and step); "image" ranks each image's candidates over
    all its loss steps at once (ceil(k n) per image), as the authors' code does."""
    uncs = []
    for final, src, cand in zip(finals, sources, candidates):
        if final is None:
            uncs.append(torch.zeros(cand.shape, device=cand.device))
            continue
        u = uncertainty_map(final.unsqueeze(1)).squeeze(0)  # [X]
        flat = torch.where(cand.reshape(-1), u[src.clamp(0, u.numel() - 1)], 0.0)
        uncs.append(flat.view(cand.shape))
    if pool == "ar_step":
        return uncs, [topk_mask(u, k, candidates=c) for u, c in zip(uncs, candidates)]
    widths = [u.shape[1] for u in uncs]
    sel = topk_mask(torch.cat(uncs, dim=1), k, candidates=torch.cat(candidates, dim=1))
    return uncs, list(torch.split(sel, widths, dim=1))


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


def content_cos(a: torch.Tensor, b: torch.Tensor, reference: float | torch.Tensor = 0.0) -> torch.Tensor:
    """Cosine of the two tokens' offsets from a reference token value, [B, N, D] x2 -> [B, N].

    cos(a - r, b - r): r (a scalar, or a [D] tensor) is the model's neutral token value
    (MARPolicy.consistency_reference), so the score measures what two tokens depict rather
    than the offset they share. With raw pixel tokens (r = 0) the white background (+1 in
    every dim) makes nearly every pair of tokens point the same way; centred on a grey
    between background and ink (TinyMAR: 0.4), blank vs blank scores 1, a fully inked token
    vs blank is negative (-0.66 for a red patch), the same ink scores 1, and another colour
    (0.02 red vs blue) or the same ink over part of the patch lies in between. r = 0 is the
    plain cosine (latent tokens that are roughly zero-mean)."""
    if isinstance(reference, torch.Tensor):
        reference = reference.to(device=a.device, dtype=torch.float32)
    return _cos(a.float() - reference, b.float() - reference)


def consistency_score(
    spec_i: torch.Tensor,
    final: torch.Tensor,
    rule: str,
    spec_prev: torch.Tensor | None = None,
    reference: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """The score the consistency filter thresholds at tau: float [B, N].

    spec_i, spec_prev: [B, N, D] speculative predictions of steps i and i-1; final: [B, N, D]
    the finally committed tokens; reference: the token value similarities are centred on
    (content_cos; 0.0 = plain cosine).
    - rule "paper": s = cos_r(xhat_i, x_fin), in [-1, 1].
    - rule "code" (authors' code): s = cos_r(xhat_i, x_fin) - cos_r(xhat_{i-1}, x_fin), in
      [-2, 2]. At step 0 there is no previous prediction (spec_prev=None); we measure the
      improvement against an uninformed prediction, cos = 0, so step 0 scores cos_r(xhat_0, x_fin).
    """
    if rule not in CONSISTENCY_RULES:
        raise ValueError(f"rule must be one of {CONSISTENCY_RULES}, got {rule!r}")
    score = content_cos(spec_i, final, reference)
    if rule == "code" and spec_prev is not None:
        score = score - content_cos(spec_prev, final, reference)
    return score


def consistency_keep(
    spec_i: torch.Tensor,
    final: torch.Tensor,
    tau: float,
    rule: str,
    committed: torch.Tensor,
    spec_prev: torch.Tensor | None = None,
    reference: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Which tokens pass the consistency filter at AR step i: bool [B, N].

    Keep n if consistency_score(...)[n] > tau (arguments as there); committed: bool [B, N]
    tokens committed at step i, always kept (their own chain produced the final token).
    reference defaults to 0.0, the plain cosine of the paper; the trainer passes the
    policy's consistency_reference.
    """
    return (consistency_score(spec_i, final, rule, spec_prev, reference) > tau) | committed


# Diagnostics of the filter (method/plan.py logs them per AR step): kept fractions at these tau
# and these quantiles of the score over the step's speculative tokens.
DIAG_TAUS = (-1.0, 0.0, 0.5)
DIAG_QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def consistency_diagnostics(score: torch.Tensor) -> torch.Tensor:
    """Scores of speculative tokens [B, m] (m >= 1) -> float [len(DIAG_TAUS) + len(DIAG_QUANTILES)]:
    the fraction with score > tau for each tau in DIAG_TAUS, then the score's quantiles
    (linear interpolation), in one tensor so that the caller reads it with one host sync."""
    s = score.float().reshape(-1)
    taus = torch.tensor(DIAG_TAUS, device=s.device)
    kept = (s.unsqueeze(0) > taus.unsqueeze(1)).float().mean(1)
    q = torch.quantile(s, torch.tensor(DIAG_QUANTILES, device=s.device))
    return torch.cat([kept, q])


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

"""The token plan of a rollout batch: what each loss AR step scores, fixed before the update.

`plan_tokens` runs without grad at theta_old (method.md §2-§3) and returns one immutable
`TokenPlan` per AR step in the loss:

1. the loss tokens of the step: the tokens it committed, plus, for the
   `committed+speculative` scope, the still-masked tokens that pass the consistency filter;
2. for the multi-trajectory estimators, the tokens that get the estimate (all candidates,
   or the top-k by the uncertainty of M fresh head chains) and their chains, weights and
   old log-probs (estimators.draw_chains). Every draw is per image (estimators.image_noise,
   keyed by the rollout's seeds), so a token's chains do not depend on the batch or rank it
   is in; `draw` picks independent repeats.

The trainer then scores each loss token once per loss head step: by its own rollout chain,
or, for the tokens in `TokenPlan.draw`, by the weighted sum over their M chains.

Top-k pool (`topk_pool`): "image" ranks each image's candidate tokens over all its loss AR
steps together and selects ceil(k n) of them, as the authors' code does (one uncertainty
mask per image); "ar_step" ranks within each AR step (ceil(k n_i) per step, which selects
every token of a step that commits one or two tokens when k <= 0.5).

Token layout of AR step i (L = n_i + m_i columns): the n_i committed tokens first, then the
m_i speculative ones. The two blocks keep the exact shapes of the rollout, so that the loss
recomputes their log-probs bit for bit and the first-pass ratio is exactly 1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

import torch

from margrpo.config import ResolvedMethod
from margrpo.models.chains import gather_rows, sample_chain
from margrpo.models.noise import UNCERTAINTY
from margrpo.models.protocol import MARPolicy, Rollout
from margrpo.rl.estimators import ESTIMATOR_STREAMS, ChainDraw, ChainNoise, draw_chains, image_noise, policy_callables
from margrpo.rl.selection import (DIAG_QUANTILES, DIAG_TAUS, consistency_diagnostics, consistency_keep,
                                  consistency_score, loss_token_mask, topk_mask, uncertainty_map)

# Per-step consistency statistics (TokenPlan.stats), in the order `loss_tokens` computes
# them: the fraction of the step's speculative tokens the filter keeps at the method's tau
# (the tokens actually used), then diagnostics that change nothing in the loss: the fraction
# it would keep at each tau of DIAG_TAUS, and quantiles of the score over those tokens.
CONSISTENCY_KEYS = (
    ("select/consistency_frac",)
    + tuple(f"select/consistency_kept_tau{t:g}" for t in DIAG_TAUS)
    + tuple(f"select/consistency_score_q{round(100 * q)}" for q in DIAG_QUANTILES)
)


class Block(NamedTuple):
    """Tokens of one AR step that the rollout sampled together (committed or speculative)."""

    idx: torch.Tensor  # [B, g] long token positions
    chain: torch.Tensor  # [T+1, B, g, D] head states; chain[T] is the token
    logp: torch.Tensor  # [T, B, g] float32 transition log-probs at rollout (theta_old)


class LossTokens(NamedTuple):
    """The loss tokens of one AR step (`loss_tokens`)."""

    blocks: tuple[Block, ...]  # committed, then speculative (committed+speculative scope)
    mask: torch.Tensor  # [B, L] bool loss tokens of the layout
    stats: dict[str, float]  # CONSISTENCY_KEYS (with the consistency filter)

    @property
    def positions(self) -> torch.Tensor:
        """[B, L] long token positions of the layout."""
        return torch.cat([b.idx for b in self.blocks], dim=1)


@dataclass(frozen=True, eq=False)
class TokenPlan:
    """What AR step `index` contributes to the loss; built complete by `plan_tokens`."""

    index: int
    head_steps: torch.Tensor  # [S] long, the head transitions scored
    blocks: tuple[Block, ...]  # committed, then speculative: the layout's L columns
    mask: torch.Tensor  # [B, L] bool loss tokens
    draw: ChainDraw | None  # M chains of the tokens that get the multi-trajectory estimate
    stats: Mapping[str, float]  # select/* and diag/uncertainty_mean of this step

    @property
    def n_committed(self) -> int:
        """n_i: the first n_i columns of the layout are the tokens committed at the step."""
        return self.blocks[0].idx.shape[1]

    @property
    def positions(self) -> torch.Tensor:
        """[B, L] long token positions of the layout."""
        return torch.cat([b.idx for b in self.blocks], dim=1)

    @property
    def single(self) -> torch.Tensor:
        """[B, L] bool: the loss tokens scored by their own rollout chain (all but `draw.rows`)."""
        if self.draw is None:
            return self.mask
        chosen = torch.zeros(self.mask.numel(), dtype=torch.bool, device=self.mask.device)
        return self.mask & ~chosen.index_fill_(0, self.draw.rows, True).view_as(self.mask)


def speculative_steps_needed(method: ResolvedMethod, ar_steps: list[int]) -> list[int]:
    """AR steps whose speculative predictions the rollout must record."""
    if method.token_scope == "committed" and not method.consistency:
        return []
    need = set(ar_steps)
    if method.consistency and method.consistency_rule == "code":
        need |= {i - 1 for i in ar_steps if i > 0}
    return sorted(need)


def loss_tokens(rollout: Rollout, i: int, method: ResolvedMethod, reference: float = 0.0) -> LossTokens:
    """Loss tokens of AR step i (committed, plus filtered speculative ones). reference: the
    policy's consistency_reference, the token value the consistency score is centred on."""
    st = rollout.steps[i]
    blocks = [Block(st.commit_idx, st.chain, st.logp)]
    b, n_tok = rollout.tokens.shape[:2]
    dev = rollout.tokens.device
    committed = torch.zeros(b, n_tok, dtype=torch.bool, device=dev).scatter_(1, st.commit_idx, True)
    keep = torch.ones(b, n_tok, dtype=torch.bool, device=dev)
    stats: dict[str, float] = {}
    if method.token_scope == "committed+speculative" and st.spec_chain is not None:
        if method.consistency:
            prev = rollout.steps[i - 1].speculative if i > 0 else None
            rule = method.consistency_rule
            keep = consistency_keep(st.speculative, rollout.tokens, method.tau, rule, committed, prev, reference)
            # Diagnostics only (nothing below feeds `keep`): the same score over the step's
            # speculative tokens [B, m_i], read together with the kept fraction in one sync.
            spec_score = torch.gather(consistency_score(st.speculative, rollout.tokens, rule, prev, reference), 1,
                                      st.spec_idx)
            frac = torch.gather(keep, 1, st.spec_idx).float().mean().view(1)
            stats.update(zip(CONSISTENCY_KEYS, torch.cat([frac, consistency_diagnostics(spec_score)]).tolist()))
        blocks.append(Block(st.spec_idx, st.spec_chain, st.spec_logp))
    full = loss_token_mask(committed, keep, method.token_scope, st.known)
    positions = torch.cat([blk.idx for blk in blocks], dim=1)  # [B, L]
    return LossTokens(tuple(blocks), torch.gather(full, 1, positions), stats)


def _uncertainty(policy: MARPolicy, zc, zu, mask, m: int, cfg: float, noise: ChainNoise):
    """Variance of M fresh chains' final tokens per token in `mask` (chains from `noise`).

    Returns (uncertainty [B, L] (0 outside mask), chains [T+1, M, R, D] of the R = mask.sum()
    tokens in row-major order and their transition log-probs [T, M, R] under the guided
    sampling policy, or (.., None, None) when there are none).
    """
    b, n = mask.shape
    rows = mask.reshape(-1).nonzero().squeeze(-1)
    out = torch.zeros(b * n, device=mask.device)
    states = logps = None
    if rows.numel() and m > 1:
        zr_c = zc.reshape(b * n, -1)[rows].unsqueeze(0).expand(m, -1, -1)
        zr_u = zu.reshape(b * n, -1)[rows].unsqueeze(0).expand(m, -1, -1)
        eps = noise(policy.sampler.num_steps + 1, m, rows, policy.token_dim)  # [T+1, M, R, D]
        states, _, _, logps = sample_chain(policy, zr_c, zr_u, eps, cfg)
        out[rows] = uncertainty_map(states[-1].unsqueeze(1)).squeeze(0)
    return out.reshape(b, n), states, logps


def _topk(uncs: list[torch.Tensor], cands: list[torch.Tensor], k: float, pool: str) -> list[torch.Tensor]:
    """Selected tokens per AR step: top ceil(k n) by uncertainty per image, ranked within
    each step ("ar_step") or over all the image's loss steps at once ("image")."""
    if pool == "ar_step":
        return [topk_mask(u, k, candidates=c) for u, c in zip(uncs, cands)]
    widths = [u.shape[1] for u in uncs]
    sel = topk_mask(torch.cat(uncs, dim=1), k, candidates=torch.cat(cands, dim=1))
    return list(torch.split(sel, widths, dim=1))


@torch.no_grad()
def plan_tokens(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: list[int],
    head_steps: list[torch.Tensor],
    method: ResolvedMethod,
    cfg_mode: str,
    draw: int = 0,
) -> list[TokenPlan]:
    """The token plan of every loss AR step (module docstring). head_steps: [S] long per AR
    step. draw: which independent repeat of the multi-trajectory chains (0 for training; the
    gradient probe compares draw 0 with draw 1)."""
    steps = [loss_tokens(rollout, i, method, policy.consistency_reference) for i in ar_steps]
    if method.estimator == "single":
        return [TokenPlan(i, hs, t.blocks, t.mask, None, t.stats) for i, hs, t in zip(ar_steps, head_steps, steps)]
    positions = [t.positions for t in steps]
    # Candidates for the multi-trajectory estimate: all loss tokens, or only the ones
    # committed at their step (mte_scope "committed", the paper's tokens).
    cands = []
    for t in steps:
        c = t.mask.clone()
        if method.mte_scope == "committed":
            c[:, t.blocks[0].idx.shape[1]:] = False
        cands.append(c)
    zs = []
    for i, pos in zip(ar_steps, positions):
        z_c, z_u = policy.encode(rollout, i)
        zs.append((gather_rows(z_c, pos), gather_rows(z_u, pos)))  # [B, L, C] latents of the layout
    selected, unc_chains, extra = cands, [(None, None)] * len(steps), {}
    if method.topk:
        uncs, unc_chains = [], []
        for i, pos, c, (zc, zu) in zip(ar_steps, positions, cands, zs):
            unc_noise = image_noise(rollout.seeds, i, pos, UNCERTAINTY, draw)
            u, states, logps = _uncertainty(policy, zc, zu, c, method.num_trajectories, rollout.cfg_scale, unc_noise)
            uncs.append(u)
            unc_chains.append((states, logps))
        selected = _topk(uncs, cands, method.k, method.topk_pool)
        n_cand = sum(int(c.sum()) for c in cands)
        n_sel = sum(int(s.sum()) for s in selected)
        extra = {"select/topk_frac": n_sel / max(1, n_cand),
                 "diag/uncertainty_mean": sum(float(u[c].sum()) for u, c in zip(uncs, cands)) / max(1, n_cand)}
    plans = []
    per_step = zip(ar_steps, head_steps, steps, positions, cands, selected, zs, unc_chains)
    for i, hs, t, pos, c, sel, (zc, zu), (states, logps) in per_step:
        reuse, reuse_logp = None, None
        if method.estimator == "resample" and states is not None:
            # The uncertainty chains are M fresh chains from the same z, exactly what
            # `resample` draws: reuse those of the selected tokens (as the authors do), and
            # their sampling log-probs as logp_old when the loss scores the same guided
            # transitions (any cfg_mode but "cond"), as the rollout chain does.
            pick = sel.reshape(-1)[c.reshape(-1)]
            reuse = states[:, :, pick]
            reuse_logp = logps[:, :, pick] if cfg_mode != "cond" else None
        logp_fn, sample_fn = policy_callables(policy, zc, zu, rollout.cfg_scale, cfg_mode)
        d = draw_chains(
            method.estimator, sampler=policy.sampler, logp_fn=logp_fn,
            chain=torch.cat([blk.chain for blk in t.blocks], dim=2),  # [T+1, B, L, D]
            logp=torch.cat([blk.logp for blk in t.blocks], dim=2),  # [T, B, L]
            mask=sel, num_chains=method.num_trajectories, sample_fn=sample_fn,
            noise=image_noise(rollout.seeds, i, pos, ESTIMATOR_STREAMS[method.estimator], draw),
            states=reuse, states_logp=reuse_logp, logp_steps=hs, keep_rollout=True,
        )
        stats = {**t.stats, **extra}
        if d.ess.numel():
            stats["select/ess"] = d.ess.median().item()
        plans.append(TokenPlan(i, hs, t.blocks, t.mask, d, stats))
    return plans

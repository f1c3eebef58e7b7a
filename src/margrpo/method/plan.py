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

Cost: when the candidates are committed tokens (`uncertainty_chains_needed`), the rollout
draws the M uncertainty chains beside its own (models/chains.py: they share the step's
transformer pass and the head's conditioning), on the same streams, so the plan neither
re-encodes the step nor runs the head for them; `resample` then reuses the selected tokens'
chains and their recorded log-probs. The plan reads the device once per loss AR step (the
selected tokens' indices) and once for all its statistics.

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
from margrpo.hostsync import read_all
from margrpo.models.chains import gather_rows, sample_chains
from margrpo.models.noise import UNCERTAINTY
from margrpo.models.protocol import ARStep, MARPolicy, Rollout
from margrpo.method.estimators import ESTIMATOR_STREAMS, ChainDraw, ChainNoise, draw_chains, image_noise, policy_callables
from margrpo.method.selection import (DIAG_QUANTILES, DIAG_TAUS, consistency_diagnostics, consistency_keep,
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
    stat_values: torch.Tensor | None  # [len(CONSISTENCY_KEYS)] on the device (with the consistency filter)

    @property
    def positions(self) -> torch.Tensor:
        """[B, L] long token positions of the layout."""
        return torch.cat([b.idx for b in self.blocks], dim=1)

    @property
    def stats(self) -> dict[str, float]:
        """CONSISTENCY_KEYS -> value (one host read; plan_tokens reads every step's at once)."""
        return {} if self.stat_values is None else dict(zip(CONSISTENCY_KEYS, self.stat_values.tolist()))


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
    stat_values = None
    if method.token_scope == "committed+speculative" and st.spec_chain is not None:
        if method.consistency:
            prev = rollout.steps[i - 1].speculative if i > 0 else None
            rule = method.consistency_rule
            keep = consistency_keep(st.speculative, rollout.tokens, method.tau, rule, committed, prev, reference)
            # Diagnostics only (nothing below feeds `keep`): the same score over the step's
            # speculative tokens [B, m_i], kept with the kept fraction in one device tensor.
            spec_score = torch.gather(consistency_score(st.speculative, rollout.tokens, rule, prev, reference), 1,
                                      st.spec_idx)
            frac = torch.gather(keep, 1, st.spec_idx).float().mean().view(1)
            stat_values = torch.cat([frac, consistency_diagnostics(spec_score)])
        blocks.append(Block(st.spec_idx, st.spec_chain, st.spec_logp))
    full = loss_token_mask(committed, keep, method.token_scope, st.known)
    positions = torch.cat([blk.idx for blk in blocks], dim=1)  # [B, L]
    return LossTokens(tuple(blocks), torch.gather(full, 1, positions), stat_values)


def uncertainty_chains_needed(method: ResolvedMethod, ar_steps: list[int]) -> tuple[int, list[int]]:
    """(M, AR steps): the uncertainty chains the rollout draws beside its own chains
    (RolloutMixin.rollout extra_chains, extra_chain_steps), for a top-k method whose
    candidates are committed tokens; (0, []) for every other method (plan_tokens then draws
    any chains it needs itself)."""
    if not method.topk or method.estimator == "single" or method.num_trajectories < 2:
        return 0, []
    if method.token_scope != "committed" and method.mte_scope != "committed":
        return 0, []
    return method.num_trajectories, list(ar_steps)


class _Chains(NamedTuple):
    """The uncertainty map of one AR step and the chains behind it: the chains of layout
    token r (a candidate) are states[:, :, src[r]]."""

    unc: torch.Tensor  # [B, L] uncertainty (0 outside the candidates)
    states: torch.Tensor | None  # [T+1, M, X, D]
    logps: torch.Tensor | None  # [T, M, X] transition log-probs under the guided sampling policy
    src: torch.Tensor | None  # [B * L] long


def _uncertainty(policy: MARPolicy, zc, zu, mask, m: int, cfg: float, noise: ChainNoise) -> _Chains:
    """Variance of M fresh chains' final tokens per token in `mask` [B, L] (chains from
    `noise`, drawn here: one head call per step for the M chains, models/chains.py
    sample_chains); states [T+1, M, R, D] of the R = mask.sum() tokens in row-major order."""
    b, n = mask.shape
    flat = mask.reshape(-1)
    rows = flat.nonzero().squeeze(-1)
    out = torch.zeros(b * n, device=mask.device)
    states = logps = None
    if rows.numel() and m > 1:
        eps = noise(policy.sampler.num_steps + 1, m, rows, policy.token_dim)  # [T+1, M, R, D]
        states, logps = sample_chains(policy, zc.reshape(b * n, -1)[rows], zu.reshape(b * n, -1)[rows], eps, cfg)
        out[rows] = uncertainty_map(states[-1].unsqueeze(1)).squeeze(0)
    return _Chains(out.reshape(b, n), states, logps, flat.long().cumsum(0) - 1)


def _rollout_uncertainty(step: ARStep, mask: torch.Tensor) -> _Chains:
    """`_uncertainty` from the chains the rollout drew for the step's committed tokens
    (ARStep.extra_chain: the same streams and latents); mask [B, L] selects only committed
    columns (the first n_i). Computed for every committed token and masked, so that no
    index is read from the device."""
    b, n = mask.shape
    t1, m, _, n_c, d = step.extra_chain.shape
    states = step.extra_chain.reshape(t1, m, -1, d)  # [T+1, M, B * n_i, D]
    unc = torch.zeros(b, n, device=mask.device)
    unc[:, :n_c] = uncertainty_map(states[-1].unsqueeze(1)).view(b, n_c)
    r = torch.arange(b * n, device=mask.device)
    src = r // n * n_c + r % n  # layout row -> row of the committed tokens
    return _Chains(torch.where(mask, unc, 0.0), states, step.extra_logp.reshape(t1 - 1, m, -1), src)


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
    gradient probe compares draw 0 with draw 1).

    The uncertainty chains of draw 0 come from the rollout when it drew them
    (uncertainty_chains_needed); the step's latents are recomputed only for what needs them
    (chains drawn here, or estimator log-probs not recorded at rollout)."""
    steps = [loss_tokens(rollout, i, method, policy.consistency_reference) for i in ar_steps]
    if method.estimator == "single":
        cons = _consistency_stats(steps, read_all({"cons": [t.stat_values for t in steps if t.stat_values is not None]}))
        return [TokenPlan(i, hs, t.blocks, t.mask, None, st) for i, hs, t, st in zip(ar_steps, head_steps, steps, cons)]
    positions = [t.positions for t in steps]
    # Candidates for the multi-trajectory estimate: all loss tokens, or only the ones
    # committed at their step (mte_scope "committed", the paper's tokens).
    cands = []
    for t in steps:
        c = t.mask.clone()
        if method.mte_scope == "committed":
            c[:, t.blocks[0].idx.shape[1]:] = False
        cands.append(c)
    latents: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def z_of(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, L, C] latents (cond, null) of loss step k's layout, encoded on first use."""
        if k not in latents:
            z_c, z_u = policy.encode(rollout, ar_steps[k])
            latents[k] = (gather_rows(z_c, positions[k]), gather_rows(z_u, positions[k]))
        return latents[k]

    m = method.num_trajectories
    committed_only = method.token_scope == "committed" or method.mte_scope == "committed"
    selected, found = cands, [None] * len(steps)
    if method.topk:
        found = []
        for k, (i, pos, c) in enumerate(zip(ar_steps, positions, cands)):
            st = rollout.steps[i]
            if draw == 0 and committed_only and st.extra_chain is not None and st.extra_chain.shape[1] == m:
                found.append(_rollout_uncertainty(st, c))
            else:
                found.append(_uncertainty(policy, *z_of(k), c, m, rollout.cfg_scale,
                                          image_noise(rollout.seeds, i, pos, UNCERTAINTY, draw)))
        uncs = [f.unc for f in found]
        selected = _topk(uncs, cands, method.k, method.topk_pool)
    draws = []
    per_step = zip(ar_steps, head_steps, steps, positions, selected, found)
    for k, (i, hs, t, pos, sel, f) in enumerate(per_step):
        rows = sel.reshape(-1).nonzero().squeeze(-1)  # [R] the step's selected tokens
        reuse, reuse_logp = None, None
        if method.estimator == "resample" and f is not None and f.states is not None:
            # The uncertainty chains are M fresh chains from the same z, exactly what
            # `resample` draws: reuse those of the selected tokens (as the authors do), and
            # their sampling log-probs as logp_old when the loss scores the same guided
            # transitions (any cfg_mode but "cond"), as the rollout chain does.
            reuse = f.states[:, :, f.src[rows]]
            reuse_logp = f.logps[:, :, f.src[rows]] if cfg_mode != "cond" else None
        logp_fn, sample_fn = _lazy_callables(policy, lambda k=k: z_of(k), rollout.cfg_scale, cfg_mode)
        draws.append(draw_chains(
            method.estimator, sampler=policy.sampler, logp_fn=logp_fn,
            chain=torch.cat([blk.chain for blk in t.blocks], dim=2),  # [T+1, B, L, D]
            logp=torch.cat([blk.logp for blk in t.blocks], dim=2),  # [T, B, L]
            mask=sel, rows=rows, num_chains=m, sample_fn=sample_fn,
            noise=image_noise(rollout.seeds, i, pos, ESTIMATOR_STREAMS[method.estimator], draw),
            states=reuse, states_logp=reuse_logp, logp_steps=hs, keep_rollout=True,
        ))
    # The plan's statistics in one host read: candidate and selected counts, the uncertainty
    # sums (per step, float32, the map being 0 outside the candidates) and the median
    # effective sample size of every step that has chains.
    with_chains = [d for d in draws if d.ess.numel()]
    groups = {"ess": [d.ess.median() for d in with_chains],
              "cons": [t.stat_values for t in steps if t.stat_values is not None]}
    if method.topk:
        groups |= {"cand": [c.sum() for c in cands], "sel": [x.sum() for x in selected],
                   "unc": [f.unc.sum() for f in found]}
    read = read_all(groups)
    extra = {}
    if method.topk:
        n_cand, n_sel = int(sum(read["cand"])), int(sum(read["sel"]))
        extra = {"select/topk_frac": n_sel / max(1, n_cand), "diag/uncertainty_mean": sum(read["unc"]) / max(1, n_cand)}
    medians = dict(zip(map(id, with_chains), read["ess"]))
    plans = []
    for i, hs, t, d, cons in zip(ar_steps, head_steps, steps, draws, _consistency_stats(steps, read)):
        ess = {"select/ess": medians[id(d)]} if id(d) in medians else {}
        plans.append(TokenPlan(i, hs, t.blocks, t.mask, d, {**cons, **extra, **ess}))
    return plans


def _consistency_stats(steps: list[LossTokens], read: dict[str, list]) -> list[dict[str, float]]:
    """Per step, CONSISTENCY_KEYS -> value from read["cons"] (the steps that have them, in order)."""
    values = iter(read["cons"])
    return [dict(zip(CONSISTENCY_KEYS, next(values))) if t.stat_values is not None else {} for t in steps]


def _lazy_callables(policy: MARPolicy, latents, cfg_scale: float, cfg_mode: str):
    """estimators.policy_callables on the latents () -> (z_c, z_u), computed only if a
    callable is called (a resample draw that reuses recorded chains calls neither)."""
    def logp_fn(*args):
        return policy_callables(policy, *latents(), cfg_scale, cfg_mode)[0](*args)

    def sample_fn(*args):
        return policy_callables(policy, *latents(), cfg_scale, cfg_mode)[1](*args)

    return logp_fn, sample_fn

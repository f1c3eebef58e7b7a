"""The token plan of a rollout batch: what each loss AR step scores, fixed before the update.

`plan_tokens` runs without grad at theta_old (method.md §2-§3) and returns one immutable
`TokenPlan` per AR step in the loss, built in three phases:

1. tokens (`loss_tokens`): the tokens the step committed, plus, for the
   `committed+speculative` scope, the still-masked tokens that pass the consistency filter;
2. top-k (multi-trajectory estimators with `topk`): the candidates ranked by the
   uncertainty of M fresh head chains, the top fraction k selected;
3. chains: for the selected tokens (all candidates without top-k), their M chains, weights
   and old log-probs (estimators.draw_chains). Every draw is per image
   (estimators.image_noise, keyed by the rollout's seeds), so a token's chains do not depend
   on the batch or rank it is in; `draw` picks independent repeats.

The plan reads nothing back from the device but the selected tokens' indices (one read per
loss AR step, phase 3). Its statistics (TokenPlan.stat_values, topk_counts, the draws'
effective sample sizes) stay on the device until the step's metrics read them with the
batch's others in one host read (training/stepstats.py).

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

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import torch

from margrpo.config import ResolvedMethod
from margrpo.models.chains import ChainScorer, gather_rows
from margrpo.models.noise import UNCERTAINTY
from margrpo.models.protocol import Rollout
from margrpo.method.estimators import ESTIMATOR_STREAMS, ChainDraw, ChainNoise, draw_chains, image_noise, policy_callables
from margrpo.method.selection import (DIAG_QUANTILES, DIAG_TAUS, consistency_diagnostics, consistency_keep,
                                  consistency_score, loss_token_mask, uncertainty_topk)

# Per-step consistency statistics (TokenPlan.stat_values), in the order `loss_tokens` computes
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


@dataclass(frozen=True, eq=False)
class TokenPlan:
    """What AR step `index` contributes to the loss. Phase 1 (`loss_tokens`) fixes the
    tokens; `plan_tokens` adds the top-k counts (phase 2) and the chains (phase 3) with
    dataclasses.replace."""

    index: int
    head_steps: torch.Tensor  # [S] long, the head transitions scored
    blocks: tuple[Block, ...]  # committed, then speculative: the layout's L columns
    mask: torch.Tensor  # [B, L] bool loss tokens
    draw: ChainDraw | None = None  # M chains of the tokens that get the multi-trajectory estimate
    # [len(CONSISTENCY_KEYS)] on the device: the consistency filter's statistics (with the filter only)
    stat_values: torch.Tensor | None = None
    # [3] float64 on the device: candidates, selected tokens, uncertainty sum (top-k only)
    topk_counts: torch.Tensor | None = None

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

    @property
    def committed_mask(self) -> torch.Tensor:
        """[B, L] bool: the loss tokens without the speculative columns."""
        mask = self.mask.clone()
        mask[:, self.n_committed:] = False
        return mask


def speculative_steps_needed(method: ResolvedMethod, ar_steps: list[int]) -> list[int]:
    """AR steps whose speculative predictions the rollout must record."""
    if method.token_scope == "committed" and not method.consistency:
        return []
    need = set(ar_steps)
    if method.consistency and method.consistency_rule == "code":
        need |= {i - 1 for i in ar_steps if i > 0}
    return sorted(need)


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


def loss_tokens(rollout: Rollout, i: int, head_steps: torch.Tensor, method: ResolvedMethod,
                reference: float = 0.0) -> TokenPlan:
    """Phase 1: the loss tokens of AR step i (committed, plus filtered speculative ones), as a
    TokenPlan without chains. reference: the policy's consistency_reference, the token value
    the consistency score is centred on."""
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
    return TokenPlan(i, head_steps, tuple(blocks), torch.gather(full, 1, positions), stat_values=stat_values)


class _Chains(NamedTuple):
    """The M uncertainty chains of one AR step's candidates: the chains of layout token r
    are states[:, :, src[r]]."""

    states: torch.Tensor | None  # [T+1, M, X, D]; None when there are none (no candidate, M < 2)
    logps: torch.Tensor | None  # [T, M, X] transition log-probs under the guided sampling policy
    src: torch.Tensor  # [B * L] long

    @property
    def final(self) -> torch.Tensor | None:
        """[M, X, D] the chains' final tokens."""
        return None if self.states is None else self.states[-1]


class _Latents:
    """[B, L, C] latents (cond, null) of each loss step's layout, encoded on first use: the
    plan re-encodes a step only for what needs it (chains drawn here, or estimator log-probs
    not recorded at rollout)."""

    def __init__(self, policy, rollout: Rollout, plans: list[TokenPlan]):
        self.policy, self.rollout, self.plans, self.cache = policy, rollout, plans, {}

    def __call__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if k not in self.cache:
            plan = self.plans[k]
            z_c, z_u = self.policy.encode(self.rollout, plan.index)
            self.cache[k] = (gather_rows(z_c, plan.positions), gather_rows(z_u, plan.positions))
        return self.cache[k]


def _uncertainty_chains(scorer: ChainScorer, rollout: Rollout, plan: TokenPlan, cand: torch.Tensor, m: int,
                        draw: int, committed_only: bool, latents) -> _Chains:
    """The M uncertainty chains of the candidates `cand` [B, L] of one AR step: those the
    rollout drew for the step's committed tokens (ARStep.extra_chain: the same streams and
    latents, read without an index from the device) when the candidates are committed
    tokens (`committed_only`) and the draw is 0, else M fresh chains
    from the step's latents (`latents()` -> (z_c, z_u) [B, L, C]), one head call per step
    for the M chains (models/chains.py sample_chains)."""
    st = rollout.steps[plan.index]
    b, n = cand.shape
    if draw == 0 and committed_only and st.extra_chain is not None and st.extra_chain.shape[1] == m:
        t1, _, _, n_c, d = st.extra_chain.shape
        r = torch.arange(b * n, device=cand.device)
        src = r // n * n_c + r % n  # layout row -> row of the committed tokens
        return _Chains(st.extra_chain.reshape(t1, m, -1, d), st.extra_logp.reshape(t1 - 1, m, -1), src)
    flat = cand.reshape(-1)
    rows = flat.nonzero().squeeze(-1)
    src = flat.long().cumsum(0) - 1  # layout row -> row among the candidates
    if not rows.numel() or m < 2:
        return _Chains(None, None, src)
    policy = scorer.policy
    t1 = policy.sampler.num_steps + 1
    eps = image_noise(rollout.seeds, plan.index, plan.positions, UNCERTAINTY, draw)(
        t1, m, rows, policy.token_dim)  # [T+1, M, R, D]
    zc, zu = latents()
    own = None  # the candidates' rollout chains, where chains under an SDE window branch from them
    if scorer.sde_steps is not None:
        own = torch.cat([blk.chain for blk in plan.blocks], dim=2).reshape(t1, b * n, -1)[:, rows]
    states, logps = scorer.sample(zc.reshape(b * n, -1)[rows], zu.reshape(b * n, -1)[rows], eps, own)
    return _Chains(states, logps, src)


@torch.no_grad()
def plan_tokens(
    scorer: ChainScorer,
    rollout: Rollout,
    ar_steps: list[int],
    head_steps: list[torch.Tensor],
    method: ResolvedMethod,
    draw: int = 0,
) -> list[TokenPlan]:
    """The token plan of every loss AR step, in the module docstring's three phases.
    scorer: the policy at theta_old and how the loss scores its chains; head_steps: [S]
    long per AR step; draw: which independent repeat of the multi-trajectory chains (0 for
    training; the gradient probe compares draw 0 with draw 1)."""
    policy = scorer.policy
    # 1. tokens
    plans = [loss_tokens(rollout, i, hs, method, policy.consistency_reference) for i, hs in zip(ar_steps, head_steps)]
    draws = [None] * len(plans)
    if method.estimator != "single":
        latents = _Latents(policy, rollout, plans)
        # Candidates for the multi-trajectory estimate: all loss tokens, or only the ones
        # committed at their step (mte_scope "committed", the paper's tokens).
        cands = [p.committed_mask if method.mte_scope == "committed" else p.mask.clone() for p in plans]
        m = method.num_trajectories
        # 2. top-k
        selected, found = cands, [None] * len(plans)
        if method.topk:
            committed_only = method.token_scope == "committed" or method.mte_scope == "committed"
            found = [_uncertainty_chains(scorer, rollout, p, c, m, draw, committed_only, lambda k=k: latents(k))
                     for k, (p, c) in enumerate(zip(plans, cands))]
            uncs, selected = uncertainty_topk([f.final for f in found], [f.src for f in found], cands, method.k,
                                              method.topk_pool)
            plans = [dataclasses.replace(p, topk_counts=torch.stack([c.sum().double(), x.sum().double(),
                                                                     u.sum().double()]))
                     for p, c, x, u in zip(plans, cands, selected, uncs)]
        # 3. chains
        draws = []
        for k, (p, sel, f) in enumerate(zip(plans, selected, found)):
            rows = sel.reshape(-1).nonzero().squeeze(-1)  # [R] the step's selected tokens
            reuse, reuse_logp = None, None
            if method.estimator == "resample" and f is not None and f.states is not None:
                # The uncertainty chains are M fresh chains from the same z, exactly what
                # `resample` draws: reuse those of the selected tokens (as the authors do), and
                # their sampling log-probs as logp_old when the loss scores the same guided
                # transitions, as the rollout chain does.
                reuse = f.states[:, :, f.src[rows]]
                reuse_logp = f.logps[:, :, f.src[rows]] if scorer.scores_sampling_policy else None
            logp_fn, sample_fn = policy_callables(scorer, lambda k=k: latents(k))
            draws.append(draw_chains(
                method.estimator, sampler=policy.sampler, logp_fn=logp_fn,
                chain=torch.cat([blk.chain for blk in p.blocks], dim=2),  # [T+1, B, L, D]
                logp=torch.cat([blk.logp for blk in p.blocks], dim=2),  # [T, B, L]
                mask=sel, rows=rows, num_chains=m, sample_fn=sample_fn,
                noise=image_noise(rollout.seeds, p.index, p.positions, ESTIMATOR_STREAMS[method.estimator], draw),
                states=reuse, states_logp=reuse_logp, logp_steps=p.head_steps, keep_rollout=True,
            ))
    return [dataclasses.replace(p, draw=d) for p, d in zip(plans, draws)]

"""The GRPO / MAR-GRPO loss of one rollout batch, over any MARPolicy.

Two phases, so that old log-probs, importance weights and every random draw are fixed
before the first update (method.md §2-§3):

1. `prepare` (no grad, parameters = theta_old): for each AR step in the loss, its loss
   tokens (the tokens it committed, plus, for the `committed+speculative` scope, the
   still-masked tokens that pass the consistency filter); then, for the multi-trajectory
   estimators, the uncertainty of every candidate token from M fresh head chains, the
   top-k selection and the estimator's chains (estimators.draw_chains). Their draws are
   per image (estimators.image_noise, keyed by the rollout's seeds), so a token's chains
   do not depend on the batch or rank it is in; `draw` picks independent repeats.
2. `loss_backward` (grad): recompute the transition log-probs at the loss head steps,
   PPO-clip per chain, add beta * exact Gaussian KL to the reference on the rollout chain,
   sum per image (losses.py: every scored transition weighs the same), divide by the
   caller's normaliser and backpropagate one AR step at a time to bound memory.

Top-k pool (`topk_pool`): "image" ranks each image's candidate tokens over all its loss AR
steps together and selects ceil(k n) of them, as the authors' code does (one uncertainty
mask per image); "ar_step" ranks within each AR step (ceil(k n_i) per step, which selects
every token of a step that commits one or two tokens when k <= 0.5).

Token layout of AR step i: the n_i committed tokens first, then the m_i speculative ones;
the two groups keep the exact shapes of the rollout so that the first-pass ratio is 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.config import ResolvedMethod, TrainConfig
from margrpo.models.chains import chain_log_probs, gather_rows, sample_chain
from margrpo.models.noise import UNCERTAINTY
from margrpo.models.protocol import MARPolicy, Rollout
from margrpo.models.samplers import gaussian_kl_same_std
from margrpo.rl.estimators import (ESTIMATOR_STREAMS, ChainDraw, ChainNoise, chain_policy_terms, draw_chains,
                                   image_noise, policy_callables)
from margrpo.rl.losses import merge_chain_terms, ppo_clipped_term, transition_sum
from margrpo.rl.selection import (DIAG_QUANTILES, DIAG_TAUS, consistency_diagnostics, consistency_keep,
                                  consistency_score, loss_token_mask, topk_mask, uncertainty_map)

# Per-step consistency statistics (StepPlan.stats), in the order _loss_tokens computes them:
# the fraction of the step's speculative tokens the filter keeps at the method's tau (the
# tokens actually used), then diagnostics that change nothing in the loss: the fraction it
# would keep at each tau of DIAG_TAUS, and quantiles of the score over those tokens.
CONSISTENCY_KEYS = (
    ("select/consistency_frac",)
    + tuple(f"select/consistency_kept_tau{t:g}" for t in DIAG_TAUS)
    + tuple(f"select/consistency_score_q{round(100 * q)}" for q in DIAG_QUANTILES)
)


@dataclass
class StepPlan:
    """What AR step i contributes to the loss (all fixed before the update)."""

    index: int
    head_steps: torch.Tensor  # [S] long, head transitions in the loss
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (idx [B,g], chain [T+1,B,g,D], logp [T,B,g])
    mask: torch.Tensor  # [B, n+m] bool loss tokens
    draw: ChainDraw | None  # multi-chain draws of the selected tokens (None: single only)
    stats: dict[str, float]
    n_committed: int = 0  # n_i: the first n_i columns of the layout are committed tokens

    @property
    def positions(self) -> torch.Tensor:
        return torch.cat([g[0] for g in self.groups], dim=1)


def speculative_steps_needed(method: ResolvedMethod, ar_steps: list[int]) -> list[int]:
    """AR steps whose speculative predictions the rollout must record."""
    if method.token_scope == "committed" and not method.consistency:
        return []
    need = set(ar_steps)
    if method.consistency and method.consistency_rule == "code":
        need |= {i - 1 for i in ar_steps if i > 0}
    return sorted(need)


def transition_slots(plans: list[StepPlan]) -> int:
    """Transition slots per image: committed tokens of the loss AR steps x loss head steps
    (the per-image part of the loss normaliser, losses.py rule step 3)."""
    return sum(p.n_committed * len(p.head_steps) for p in plans)


def _loss_tokens(rollout: Rollout, i: int, hs: torch.Tensor, method: ResolvedMethod,
                 reference: float = 0.0) -> StepPlan:
    """Loss tokens of AR step i (committed, plus filtered speculative ones). reference: the
    policy's consistency_reference, the token value the consistency score is centred on."""
    st = rollout.steps[i]
    n = st.commit_idx.shape[1]
    groups = [(st.commit_idx, st.chain, st.logp)]
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
        groups.append((st.spec_idx, st.spec_chain, st.spec_logp))
    full = loss_token_mask(committed, keep, method.token_scope, st.known)
    positions = torch.cat([g[0] for g in groups], dim=1)
    return StepPlan(i, hs, groups, torch.gather(full, 1, positions), None, stats, n)


def _uncertainty(policy: MARPolicy, zc, zu, mask, m: int, cfg: float, noise: ChainNoise):
    """Variance of M fresh chains' final tokens per token in `mask` (chains from `noise`).

    Returns (uncertainty [B, n+m] (0 outside mask), chains [T+1, M, R, D] of the R = mask.sum()
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
def prepare(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: list[int],
    head_steps: list[torch.Tensor],
    method: ResolvedMethod,
    cfg_mode: str,
    draw: int = 0,
) -> list[StepPlan]:
    """The loss plan of every loss AR step (module docstring, phase 1). draw: which
    independent repeat of the multi-trajectory chains (0 for training; the gradient probe
    compares draw 0 with draw 1)."""
    ref = policy.consistency_reference
    plans = [_loss_tokens(rollout, i, hs, method, ref) for i, hs in zip(ar_steps, head_steps)]
    if method.estimator == "single":
        return plans
    # Candidates for the multi-trajectory estimate: all loss tokens, or only the ones
    # committed at their step (mte_scope "committed", the paper's tokens).
    cands = []
    for p in plans:
        c = p.mask.clone()
        if method.mte_scope == "committed":
            c[:, p.n_committed:] = False
        cands.append(c)
    zs = []
    for p in plans:
        z_c, z_u = policy.encode(rollout, p.index)
        zs.append((gather_rows(z_c, p.positions), gather_rows(z_u, p.positions)))
    selected, unc_chains = cands, [(None, None)] * len(plans)
    if method.topk:
        uncs, unc_chains = [], []
        for p, c, (zc, zu) in zip(plans, cands, zs):
            unc_noise = image_noise(rollout.seeds, p.index, p.positions, UNCERTAINTY, draw)
            u, states, logps = _uncertainty(policy, zc, zu, c, method.num_trajectories, rollout.cfg_scale, unc_noise)
            uncs.append(u)
            unc_chains.append((states, logps))
        selected = _topk(uncs, cands, method.k, method.topk_pool)
        n_cand = sum(int(c.sum()) for c in cands)
        n_sel = sum(int(s.sum()) for s in selected)
        frac = n_sel / max(1, n_cand)
        unc_mean = sum(float(u[c].sum()) for u, c in zip(uncs, cands)) / max(1, n_cand)
    for j, (p, c, sel, (zc, zu)) in enumerate(zip(plans, cands, selected, zs)):
        reuse, reuse_logp = None, None
        states, logps = unc_chains[j]
        if method.estimator == "resample" and states is not None:
            # The uncertainty chains are M fresh chains from the same z, exactly what
            # `resample` draws: reuse those of the selected tokens (as the authors do), and
            # their sampling log-probs as logp_old when the loss scores the same guided
            # transitions (any cfg_mode but "cond"), as the rollout chain does.
            pick = sel.reshape(-1)[c.reshape(-1)]
            reuse = states[:, :, pick]
            reuse_logp = logps[:, :, pick] if cfg_mode != "cond" else None
        chain = torch.cat([g[1] for g in p.groups], dim=2)
        logp = torch.cat([g[2] for g in p.groups], dim=2)
        logp_fn, sample_fn = policy_callables(policy, zc, zu, rollout.cfg_scale, cfg_mode)
        p.draw = draw_chains(
            method.estimator, sampler=policy.sampler, logp_fn=logp_fn, chain=chain, logp=logp,
            mask=sel, num_chains=method.num_trajectories, sample_fn=sample_fn,
            noise=image_noise(rollout.seeds, p.index, p.positions, ESTIMATOR_STREAMS[method.estimator], draw),
            states=reuse, states_logp=reuse_logp, logp_steps=p.head_steps, keep_rollout=True,
        )
        if p.draw.ess.numel():
            p.stats["select/ess"] = p.draw.ess.median().item()
        if method.topk:
            p.stats["select/topk_frac"] = frac
            p.stats["diag/uncertainty_mean"] = unc_mean
    return plans


def _group_terms(policy, ref, rollout, plan, zc_all, zu_all, ref_z, adv, tcfg, cfg_mode):
    """Single-chain PPO terms [S, B, n+m], KL terms [S, B, n+m] and PPO stats."""
    pg, kl, stats = [], [], []
    steps = plan.head_steps.tolist()
    for idx, chain, logp in plan.groups:
        zc, zu = gather_rows(zc_all, idx), gather_rows(zu_all, idx)
        lp, mean, std = chain_log_probs(policy, zc, zu, chain, steps, rollout.cfg_scale, cfg_mode)
        term, st = ppo_clipped_term(lp, logp[plan.head_steps], adv.view(1, -1, 1), tcfg.clip_range)
        pg.append(term)
        stats.append(st)
        if ref is not None:
            with torch.no_grad():
                rc, ru = gather_rows(ref_z[0], idx), gather_rows(ref_z[1], idx)
                _, mean_ref, _ = chain_log_probs(ref, rc, ru, chain, steps, rollout.cfg_scale, cfg_mode)
            kl.append(gaussian_kl_same_std(mean, mean_ref, std))
    return torch.cat(pg, dim=2), (torch.cat(kl, dim=2) if kl else None), stats


def loss_backward(
    policy: MARPolicy,
    ref: MARPolicy | None,
    rollout: Rollout,
    plans: list[StepPlan],
    adv: torch.Tensor,
    tcfg: TrainConfig,
    normaliser: float,
    image_weight: torch.Tensor | None = None,
) -> dict[str, float]:
    """Accumulate d(loss)/d(params) into .grad; returns loss and PPO statistics.

    normaliser: the loss is sum(terms) / normaliser; the trainer passes (images in the
    global batch) x transition_slots(plans). image_weight: optional [B] 0/1 mask restricting
    the loss to some images (the gradient probe's group halves; pass a matching normaliser).
    """
    cfg_mode = tcfg.cfg_mode
    use_kl = ref is not None and tcfg.beta_kl > 0
    b = adv.shape[0]
    w = torch.ones(b, device=adv.device) if image_weight is None else image_weight.float()
    tot_pg = tot_kl = 0.0
    clip_n = akl = cnt = 0.0
    for plan in plans:
        z_c, z_u = policy.encode(rollout, plan.index)
        ref_z = None
        if use_kl:
            with torch.no_grad():
                ref_z = ref.encode(rollout, plan.index)
        pg, kl, st = _group_terms(policy, ref if use_kl else None, rollout, plan, z_c, z_u, ref_z, adv, tcfg, cfg_mode)
        if plan.draw is not None and plan.draw.rows.numel():
            pos = plan.positions
            n_tok = pos.shape[1]
            m = plan.draw.num_chains

            def rows_of(z):
                return gather_rows(z, pos).reshape(b * n_tok, -1)[plan.draw.rows].unsqueeze(0).expand(m, -1, -1)

            lp, _, _ = chain_log_probs(
                policy, rows_of(z_c), rows_of(z_u), plan.draw.states, plan.head_steps.tolist(),
                rollout.cfg_scale, cfg_mode,
            )
            chain_terms, cst = chain_policy_terms(plan.draw, lp, adv, tcfg.clip_range, n_tok, plan.head_steps)
            pg = merge_chain_terms(pg, chain_terms, plan.draw.rows)
            st.append(cst)
        loss = (transition_sum(pg, plan.mask) * w).sum() / normaliser
        tot_pg += loss.item()
        if kl is not None:
            kl_loss = (transition_sum(kl, plan.mask) * w).sum() / normaliser
            tot_kl += kl_loss.item()
            loss = loss + tcfg.beta_kl * kl_loss
        loss.backward()
        for s in st:
            clip_n += float(s["clipfrac"])
            akl += float(s["approx_kl"])
            cnt += 1
    return {
        "loss/policy": tot_pg,
        "loss/kl": tot_kl,
        "diag/clipfrac": clip_n / max(cnt, 1),
        "diag/approx_kl": akl / max(cnt, 1),
    }

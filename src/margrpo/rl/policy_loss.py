"""The GRPO / MAR-GRPO loss of one rollout batch, over any MARPolicy.

Two phases, so that old log-probs, importance weights and every random draw are fixed
before the first update (method.md §2-§3):

1. `prepare` (no grad, parameters = theta_old): for each AR step in the loss, gather its
   loss tokens (committed, plus speculative ones that pass the consistency filter), the
   uncertainty map from M fresh head chains, the top-k selection and the estimator's
   chains (estimators.draw_chains).
2. `loss_backward` (grad): recompute the transition log-probs at the loss head steps,
   PPO-clip per chain, add beta * exact Gaussian KL to the reference on the rollout chain,
   aggregate (losses.py docstring: mean over tokens, head steps, then (AR step, image)
   pairs) and backpropagate one AR step at a time to bound memory.

Token layout of AR step i: the n_i committed tokens first, then the m_i speculative ones;
the two groups keep the exact shapes of the rollout so that the first-pass ratio is 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from margrpo.config import ResolvedMethod, TrainConfig
from margrpo.models.chains import chain_log_probs, gather_rows, sample_chain
from margrpo.models.protocol import MARPolicy, Rollout
from margrpo.rl.estimators import ChainDraw, chain_policy_terms, draw_chains, policy_callables
from margrpo.rl.losses import gaussian_kl, merge_chain_terms, ppo_clipped_term, token_mean
from margrpo.rl.selection import consistency_keep, topk_mask, uncertainty_map


@dataclass
class StepPlan:
    """What AR step i contributes to the loss (all fixed before the update)."""

    index: int
    head_steps: torch.Tensor  # [S] long, head transitions in the loss
    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (idx [B,g], chain [T+1,B,g,D], logp [T,B,g])
    mask: torch.Tensor  # [B, n+m] bool loss tokens
    draw: ChainDraw | None  # multi-chain draws of the selected tokens (None: single only)
    stats: dict[str, float]

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


def _uncertainty(policy: MARPolicy, zc, zu, mask, m: int, cfg: float, gen: torch.Generator):
    """Variance of M fresh chains' final tokens per token in `mask`.

    Returns (uncertainty [B, n+m] (0 outside mask), chains [T+1, M, R, D] of the R = mask.sum()
    tokens in row-major order and their transition log-probs [T, M, R] under the guided
    sampling policy, or (.., None, None) when there are none).
    """
    b, n = mask.shape
    rows = mask.reshape(-1).nonzero().squeeze(-1)
    out = torch.zeros(b * n)
    states = logps = None
    if rows.numel() and m > 1:
        zr_c = zc.reshape(b * n, -1)[rows].unsqueeze(0).expand(m, -1, -1)
        zr_u = zu.reshape(b * n, -1)[rows].unsqueeze(0).expand(m, -1, -1)
        noise = torch.randn(policy.sampler.num_steps + 1, m, rows.numel(), policy.token_dim, generator=gen)
        states, _, _, logps = sample_chain(policy, zr_c, zr_u, noise, cfg)
        out[rows] = uncertainty_map(states[-1].unsqueeze(1)).squeeze(0)
    return out.reshape(b, n), states, logps


@torch.no_grad()
def prepare(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: list[int],
    head_steps: list[torch.Tensor],
    method: ResolvedMethod,
    cfg_mode: str,
    gen: torch.Generator,
) -> list[StepPlan]:
    plans = []
    final = rollout.tokens
    for i, hs in zip(ar_steps, head_steps):
        st = rollout.steps[i]
        groups = [(st.commit_idx, st.chain, st.logp)]
        committed = torch.ones_like(st.commit_idx, dtype=torch.bool)
        masks = [committed]
        stats: dict[str, float] = {}
        if method.token_scope == "committed+speculative" and st.spec_chain is not None:
            keep = torch.ones(st.spec_idx.shape, dtype=torch.bool)
            if method.consistency:
                prev = rollout.steps[i - 1].speculative if i > 0 else None
                committed_full = torch.zeros(final.shape[:2], dtype=torch.bool).scatter_(1, st.commit_idx, True)
                keep_full = consistency_keep(st.speculative, final, method.tau, method.consistency_rule, committed_full, prev)
                keep = torch.gather(keep_full, 1, st.spec_idx)
                stats["select/consistency_frac"] = keep.float().mean().item()
            groups.append((st.spec_idx, st.spec_chain, st.spec_logp))
            masks.append(keep)
        mask = torch.cat(masks, dim=1)
        # Tokens that may get the multi-trajectory estimate: all loss tokens, or only the
        # ones committed at this step (the first n columns of the layout).
        candidates = mask.clone()
        if method.mte_scope == "committed":
            candidates[:, committed.shape[1]:] = False
        pos = torch.cat([g[0] for g in groups], dim=1)
        chain = torch.cat([g[1] for g in groups], dim=2)
        logp = torch.cat([g[2] for g in groups], dim=2)
        draw = None
        if method.estimator != "single":
            z_c, z_u = policy.encode(rollout, i)
            zc, zu = gather_rows(z_c, pos), gather_rows(z_u, pos)
            selected, reuse, reuse_logp = candidates, None, None
            if method.topk:
                unc, unc_chains, unc_logp = _uncertainty(
                    policy, zc, zu, candidates, method.num_trajectories, rollout.cfg_scale, gen
                )
                selected = topk_mask(unc, method.k, candidates=candidates)
                if method.estimator == "resample" and unc_chains is not None:
                    # The uncertainty chains are M fresh chains from the same z, exactly what
                    # `resample` draws: reuse those of the selected tokens (as the authors do),
                    # and their sampling log-probs as logp_old when the loss scores the same
                    # guided transitions (any cfg_mode but "cond"), as the rollout chain does.
                    pick = selected.reshape(-1)[candidates.reshape(-1)]
                    reuse = unc_chains[:, :, pick]
                    reuse_logp = unc_logp[:, :, pick] if cfg_mode != "cond" else None
                stats["diag/uncertainty_mean"] = unc[candidates].mean().item() if candidates.any() else 0.0
                stats["select/topk_frac"] = selected.sum().item() / max(1, mask.sum().item())
            logp_fn, sample_fn = policy_callables(policy, zc, zu, rollout.cfg_scale, cfg_mode)
            draw = draw_chains(
                method.estimator, sampler=policy.sampler, logp_fn=logp_fn, chain=chain, logp=logp,
                mask=selected, num_chains=method.num_trajectories, generator=gen, sample_fn=sample_fn,
                states=reuse, states_logp=reuse_logp, logp_steps=hs,
            )
            if draw.ess.numel():
                stats["select/ess"] = draw.ess.median().item()
        plans.append(StepPlan(i, hs, groups, mask, draw, stats))
    return plans


def _group_terms(policy, ref, rollout, plan, zc_all, zu_all, ref_z, adv, tcfg, cfg_mode):
    """Single-chain PPO terms [S, B, n+m], KL terms [S, B, n+m] and PPO stats."""
    pg, kl, stats = [], [], []
    for idx, chain, logp in plan.groups:
        zc, zu = gather_rows(zc_all, idx), gather_rows(zu_all, idx)
        lp, mean, std = chain_log_probs(policy, zc, zu, chain, plan.head_steps.tolist(), rollout.cfg_scale, cfg_mode)
        term, st = ppo_clipped_term(lp, logp[plan.head_steps], adv.view(1, -1, 1), tcfg.clip_range)
        pg.append(term)
        stats.append(st)
        if ref is not None:
            with torch.no_grad():
                rc, ru = gather_rows(ref_z[0], idx), gather_rows(ref_z[1], idx)
                _, mean_ref, _ = chain_log_probs(ref, rc, ru, chain, plan.head_steps.tolist(), rollout.cfg_scale, cfg_mode)
            kl.append(gaussian_kl(mean, mean_ref, std))
    return torch.cat(pg, dim=2), (torch.cat(kl, dim=2) if kl else None), stats


def loss_backward(
    policy: MARPolicy,
    ref: MARPolicy | None,
    rollout: Rollout,
    plans: list[StepPlan],
    adv: torch.Tensor,
    tcfg: TrainConfig,
    image_weight: torch.Tensor | None = None,
) -> dict[str, float]:
    """Accumulate d(loss)/d(params) into .grad; returns loss and PPO statistics.

    image_weight: optional [B] 0/1 mask restricting the loss to some images (the
    gradient probe's group halves); the normaliser counts only those images.
    """
    cfg_mode = tcfg.cfg_mode
    use_kl = ref is not None and tcfg.beta_kl > 0
    b = adv.shape[0]
    w = torch.ones(b) if image_weight is None else image_weight.float()
    valid_pairs = sum(float(((p.mask.sum(1) > 0).float() * w).sum()) for p in plans)
    norm = max(valid_pairs, 1.0)
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
            zr = lambda z: gather_rows(z, pos).reshape(b * n_tok, -1)[plan.draw.rows].unsqueeze(0).expand(m, -1, -1)
            lp, _, _ = chain_log_probs(
                policy, zr(z_c), zr(z_u), plan.draw.states, plan.head_steps.tolist(), rollout.cfg_scale, cfg_mode
            )
            chain_terms, cst = chain_policy_terms(plan.draw, lp, adv, tcfg.clip_range, n_tok, plan.head_steps)
            pg = merge_chain_terms(pg, chain_terms, plan.draw.rows)
            st.append(cst)
        val_pg, ok = token_mean(pg, plan.mask)
        loss = (val_pg * ok * w).sum() / norm
        tot_pg += loss.item()
        if kl is not None:
            val_kl, _ = token_mean(kl, plan.mask)
            kl_loss = (val_kl * ok * w).sum() / norm
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

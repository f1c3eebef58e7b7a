"""Head chains over any `MARPolicy`: guided outputs, sampling and log-prob evaluation (the
rollout that draws them with these functions is models/rollout.py `RolloutMixin`).

One code path serves the rollout, the recomputation in the loss, the uncertainty map and
the multi-trajectory estimators, so that "recompute == rollout" holds by construction:
the guided head output is always computed on the concatenated [cond; null] rows in one
call, with the same shapes as at rollout.

Shapes: a chain has states [T+1, *rows, D]; z_c, z_u: [*rows, C].
"""
from __future__ import annotations

from typing import Sequence

import torch

from margrpo.models.protocol import MARPolicy, Rollout
from margrpo.models.samplers import gaussian_log_prob
from margrpo.models.sde_window import branch_point, finish_early, stochastic_steps, window_end

CFG_MODES = ("guided", "guided_full", "cond")


def guided_output(
    policy: MARPolicy,
    x: torch.Tensor,
    j: int,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    cfg_scale: float,
    cfg_mode: str = "guided",
) -> torch.Tensor:
    """Head output used for the Gaussian mean at head step j. x: [*rows, D].

    guided: u + w (c - u), the distribution the rollout sampled from (method.md §2), with no
      gradient through the null-prompt branch u (a common choice: the update then moves
      only the prompted branch, and a prompt-independent change counts w times).
    guided_full: the same mean with the exact gradient w dc + (1 - w) du (train.cfg_null_grad).
    cond: c alone, what the authors' training code scores (kept for comparison).
    A policy whose head output has channels that are not guided (Harmon's learned
    variance) defines `guide(c, u, w)`; the output may be wider than D ([*rows, D'])."""
    rows = x.shape[:-1]
    xf, zc, zu = x.reshape(-1, x.shape[-1]), z_c.reshape(-1, z_c.shape[-1]), z_u.reshape(-1, z_u.shape[-1])
    r = xf.shape[0]
    t = torch.full((2 * r,), policy.sampler.time_input(j), device=x.device)
    out = policy.head_output(torch.cat([xf, xf]), t, torch.cat([zc, zu]))
    g = _guide(policy, out[:r], out[r:], cfg_scale, cfg_mode)
    return g.reshape(*rows, g.shape[-1])


def _guide(policy: MARPolicy, c: torch.Tensor, u: torch.Tensor, cfg_scale: float, cfg_mode: str) -> torch.Tensor:
    """The head output of `cfg_mode` (guided_output) from the prompted and null outputs."""
    if cfg_mode == "cond":
        return c
    if cfg_mode in ("guided", "guided_full"):
        if cfg_mode == "guided":
            u = u.detach()
        guide = getattr(policy, "guide", None)
        return guide(c, u, cfg_scale) if guide is not None else u + cfg_scale * (c - u)
    raise ValueError(f"cfg_mode must be one of {CFG_MODES}, got {cfg_mode!r}")


def shared_guided_output(
    policy: MARPolicy,
    x: torch.Tensor,
    j: int,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    cfg_scale: float,
    cfg_mode: str = "guided",
    cond: object = None,
) -> tuple[torch.Tensor, object]:
    """guided_output for K chains per row that share the row's latents: x [K, *rows, D],
    z_c, z_u [*rows, C] -> (out [K, *rows, D'], cond).

    A policy that splits its head in two (TinyMAR: head_condition(t, z) -> cond, the part
    that reads only t and z, about two thirds of the head's multiply-adds, and
    head_apply(x [..., R, D], cond) -> [..., R, D']) computes cond once per row for all K
    chains; `cond` returned by a call at the same j and rows is reused (None: compute it).
    Each chain's output equals guided_output's on the expanded latents (the head treats
    rows independently). Other policies: guided_output on the latents expanded K times
    (cond is then None)."""
    k, rows, d = x.shape[0], x.shape[1:-1], x.shape[-1]
    if not hasattr(policy, "head_condition"):
        out = guided_output(policy, x, j, z_c.expand(k, *z_c.shape), z_u.expand(k, *z_u.shape), cfg_scale, cfg_mode)
        return out, None
    xf = x.reshape(k, -1, d)
    r = xf.shape[1]
    if cond is None:
        t = torch.full((2 * r,), policy.sampler.time_input(j), device=x.device)
        cond = policy.head_condition(t, torch.cat([z_c.reshape(r, z_c.shape[-1]), z_u.reshape(r, z_u.shape[-1])]))
    out = policy.head_apply(torch.cat([xf, xf], dim=1), cond)  # [K, 2R, D']
    g = _guide(policy, out[:, :r], out[:, r:], cfg_scale, cfg_mode)
    return g.reshape(k, *rows, g.shape[-1]), cond


def sample_chain(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    noise: torch.Tensor,
    cfg_scale: float,
    sde_steps: Sequence[int] | None = None,
    cfg_mode: str = "guided",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the head from noise[0] with step noises noise[1..T] (all [*rows, D]); transitions
    outside `sde_steps` (None: none) are deterministic and ignore their noise. cfg_mode
    matters only under autograd (guided_output): "guided_full" differentiates through the
    null branch too, as a pathwise gradient must.

    Returns chain [T+1, *rows, D], mean [T, *rows, D], std [T, *rows], logp [T, *rows]
    (std and logp 0 at deterministic transitions).
    """
    sampler = policy.sampler
    x = noise[0]
    chain, means, stds, logps = [x], [], [], []
    for j, sde in enumerate(stochastic_steps(sde_steps, sampler.num_steps)):
        out = guided_output(policy, x, j, z_c, z_u, cfg_scale, cfg_mode)
        x, mean, std, lp = sampler.step(x, j, out, noise[j + 1], sde)
        chain.append(x)
        means.append(mean)
        stds.append(std)
        logps.append(lp)
    return torch.stack(chain), torch.stack(means), torch.stack(stds), torch.stack(logps)


def sample_chains(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    noise: torch.Tensor,
    cfg_scale: float,
    sde_steps: Sequence[int] | None = None,
    branch_from: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K chains per row from the rows' shared latents z_c, z_u [*rows, C]: noise
    [T+1, K, *rows, D] -> (chain [T+1, K, *rows, D], logp [T, K, *rows]), one head call per
    step for all K (shared_guided_output). Chain k equals sample_chain from noise[:, k].

    With an SDE window (sde_steps), the K chains branch from `branch_from` [T+1, *rows, D]
    (the rollout chain of the same rows): they copy its states up to the window's first
    transition (branch_point) and draw from there, so no head call is spent on the shared
    deterministic prefix, and stop at the window's end (window_end); logp is 0 outside the
    window."""
    sampler = policy.sampler
    k, t = noise.shape[1], sampler.num_steps
    sde = stochastic_steps(sde_steps, t)
    start, end = branch_point(sde_steps) or 0, window_end(sde_steps, t)
    if start:
        if branch_from is None:
            raise ValueError("chains under an SDE window branch from the rollout chain: pass branch_from")
        chain = [branch_from[j].unsqueeze(0).expand(k, *branch_from.shape[1:]) for j in range(start + 1)]
    else:
        chain = [noise[0]]
    x = chain[-1]
    zero = torch.zeros(noise.shape[1:-1], device=noise.device)
    logps = [zero] * start
    for j in range(start, t):
        out, _ = shared_guided_output(policy, x, j, z_c, z_u, cfg_scale)
        if j == end:
            finish_early(sampler, chain, logps, x, j, out, zero)
            break
        x, _, _, lp = sampler.step(x, j, out, noise[j + 1], sde[j])
        chain.append(x)
        logps.append(lp)
    return torch.stack(chain), torch.stack(logps)


def sample_chain_with_extras(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    noise: torch.Tensor,
    extra_noise: torch.Tensor,
    cfg_scale: float,
    sde_steps: Sequence[int] | None = None,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]:
    """sample_chain from noise [T+1, *rows, D] (bit for bit) and, from the same latents,
    K more chains (extra_noise [T+1, K, *rows, D]) that share its head conditioning at
    every step; under an SDE window they share its states up to the window's first
    transition, branch there and stop at the window's end (sample_chains). Returns (sample_chain's four tensors,
    (chain [T+1, K, *rows, D], logp [T, K, *rows]))."""
    sampler = policy.sampler
    k = extra_noise.shape[1]
    sde = stochastic_steps(sde_steps, sampler.num_steps)
    start, end = branch_point(sde_steps) or 0, window_end(sde_steps, sampler.num_steps)
    x = noise[0]
    chain, means, stds, logps, extra_logps = [x], [], [], [], []
    zero = torch.zeros(extra_noise.shape[1:-1], device=extra_noise.device)
    xs, extra = (None, []) if start else (extra_noise[0], [extra_noise[0]])
    for j in range(sampler.num_steps):
        if xs is None and j == start:  # branch: the extra chains copy states 0..start
            extra = [c.unsqueeze(0).expand(k, *c.shape) for c in chain]
            xs = extra[-1]
        out, cond = shared_guided_output(policy, x.unsqueeze(0), j, z_c, z_u, cfg_scale)
        if xs is not None and j == end:  # the extra chains stop at the window's end
            out_extra, _ = shared_guided_output(policy, xs, j, z_c, z_u, cfg_scale, cond=cond)
            finish_early(sampler, extra, extra_logps, xs, j, out_extra, zero)
            xs = None
        x, mean, std, lp = sampler.step(x, j, out[0], noise[j + 1], sde[j])
        chain.append(x)
        means.append(mean)
        stds.append(std)
        logps.append(lp)
        if xs is None:
            if j < start:
                extra_logps.append(zero)
            continue
        out_extra, _ = shared_guided_output(policy, xs, j, z_c, z_u, cfg_scale, cond=cond)
        xs, _, _, lp_extra = sampler.step(xs, j, out_extra, extra_noise[j + 1], sde[j])
        extra.append(xs)
        extra_logps.append(lp_extra)
    main = (torch.stack(chain), torch.stack(means), torch.stack(stds), torch.stack(logps))
    return main, (torch.stack(extra), torch.stack(extra_logps))


def chain_log_probs(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    states: torch.Tensor,
    head_steps: Sequence[int],
    cfg_scale: float,
    cfg_mode: str = "guided",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Policy transition log-probs of given states [T+1, *rows, D] at `head_steps`.

    z_c, z_u: [*rows, C]; or, for states [T+1, K, *rows', D] of K chains per row, the rows'
    own [*rows', C], which the K chains share (shared_guided_output: one head call per step).
    Returns (logp, mean, std) stacked over head_steps: [S, *rows], [S, *rows, D], [S, *rows].
    """
    shared = states.dim() - 2 > z_c.dim() - 1
    logps, means, stds = [], [], []
    for j in head_steps:
        if shared:
            out, _ = shared_guided_output(policy, states[j], j, z_c, z_u, cfg_scale, cfg_mode)
        else:
            out = guided_output(policy, states[j], j, z_c, z_u, cfg_scale, cfg_mode)
        mean, std = policy.sampler.transition(states[j], j, out)
        logps.append(gaussian_log_prob(states[j + 1], mean, std))
        means.append(mean)
        stds.append(std)
    return torch.stack(logps), torch.stack(means), torch.stack(stds)


class ChainScorer:
    """How the loss scores and draws head chains of one policy: the policy, the guidance scale
    its rollout sampled with, the loss's guidance mode (CFG_MODES; params' train.cfg_mode)
    and the rollout's SDE window (Rollout.sde_steps; None: every transition stochastic).
    Built once per batch, so that nothing below the trainer carries them.

    z_c, z_u: [*rows, C] latents of the scored tokens; states [T+1, *rows, D], or
    [T+1, K, *rows, D] for K chains per row that share its latents."""

    def __init__(self, policy: MARPolicy, cfg_scale: float, cfg_mode: str = "guided",
                 sde_steps: Sequence[int] | None = None):
        if cfg_mode not in CFG_MODES:
            raise ValueError(f"cfg_mode must be one of {CFG_MODES}, got {cfg_mode!r}")
        self.policy, self.cfg_scale, self.cfg_mode = policy, cfg_scale, cfg_mode
        self.sde_steps = None if sde_steps is None else tuple(sde_steps)

    @property
    def scores_sampling_policy(self) -> bool:
        """True when the loss scores the guided transitions the sampler drew from (any mode
        but "cond"): log-probs recorded at sampling then serve as logp_old."""
        return self.cfg_mode != "cond"

    def log_probs(self, z_c: torch.Tensor, z_u: torch.Tensor, states: torch.Tensor,
                  head_steps: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(logp [S, *rows], mean [S, *rows, D], std [S, *rows]) at `head_steps` (chain_log_probs)."""
        if self.sde_steps is not None and not set(head_steps) <= set(self.sde_steps):
            raise ValueError(f"head steps {sorted(set(head_steps) - set(self.sde_steps))} are deterministic "
                             f"under the SDE window {self.sde_steps} and have no log-prob")
        return chain_log_probs(self.policy, z_c, z_u, states, head_steps, self.cfg_scale, self.cfg_mode)

    def sample(self, z_c: torch.Tensor, z_u: torch.Tensor, noise: torch.Tensor,
               branch_from: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """K chains per row drawn with the guided mean, as at rollout (sample_chains):
        noise [T+1, K, *rows, D] -> (states [T+1, K, *rows, D], logp [T, K, *rows]); under
        an SDE window they branch from `branch_from` [T+1, *rows, D], the rows' rollout chain."""
        return sample_chains(self.policy, z_c, z_u, noise, self.cfg_scale, self.sde_steps, branch_from)


def gather_rows(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """z: [B, N, C], idx: [B, n] -> [B, n, C]."""
    return torch.gather(z, 1, idx.unsqueeze(-1).expand(-1, -1, z.shape[-1]))


def scatter_tokens(canvas: torch.Tensor, idx: torch.Tensor, tokens: torch.Tensor) -> None:
    """canvas [B, N, D] <- tokens [B, n, D] at positions idx [B, n], in place."""
    canvas.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, canvas.shape[-1]), tokens)


def recompute_log_probs(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: Sequence[int] | None = None,
    head_steps: Sequence[int] | None = None,
    cfg_mode: str = "guided",
) -> torch.Tensor:
    """Log-probs of the rollout's own transitions under the current parameters.

    Returns [len(ar_steps), len(head_steps), B, n] (requires equal n_i over the chosen
    steps; use one step at a time otherwise). With unchanged parameters this equals the
    recorded `step.logp` (same shapes, same ops).
    """
    ar_steps = range(len(rollout.steps)) if ar_steps is None else ar_steps
    head_steps = range(policy.sampler.num_steps) if head_steps is None else head_steps
    out = []
    for i in ar_steps:
        step = rollout.steps[i]
        z_c, z_u = policy.encode(rollout, i)
        zc, zu = gather_rows(z_c, step.commit_idx), gather_rows(z_u, step.commit_idx)
        lp, _, _ = chain_log_probs(policy, zc, zu, step.chain, head_steps, rollout.cfg_scale, cfg_mode)
        out.append(lp)
    return torch.stack(out)

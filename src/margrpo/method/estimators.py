"""Multi-trajectory estimators of the policy term of a committed token (method.md §3.2).

For one AR step, `draw_chains` returns, for the tokens selected by a mask, M chains per
token with their weights and old log-probs. The loss then evaluates the current policy's
transition log-probs on those chains and applies `ppo_clipped_term(logp_new, logp_old, A,
clip, weight)` per chain; the chain terms of a token are summed (losses.py). At theta_old,
d/dtheta sum_s w_s exp(logp_theta^(s) - logp_old^(s)) A = A * sum_s w_s * score_s, i.e.
A times the estimator of d log p_theta(x0) / dtheta:

- single: the rollout chain itself, w = 1 (one exact posterior sample: unbiased, noisy).
- resample: M fresh chains from the same z drawn under the old policy, w = 1/M (the paper /
  authors' code). They do not end in x0. The trainer passes the uncertainty map's chains
  (`states`), which also chose the tokens: on the selected tokens their score is not
  zero-mean (method.md §3.2; probes/resample_bias.py measures it).
- elbo: M chains of the forward process q(s_{0:T-1} | s_T = x0), w = 1/M: the gradient of
  the diffusion ELBO; low variance but biased unless the head is the exact reverse of q.
- posterior: the same q-chains with self-normalised importance weights
  w_s ∝ p_old(s_{0:T}) / q(s_{0:T-1} | x0), p_old including the N(0, I) prior of s_0;
  consistent (Fisher's identity), held fixed (no gradient). With keep_rollout (the
  trainer's setting) the rollout chain, itself an exact draw from the posterior of chains
  ending in x0, is chain 0 with weight 1/(M+1) and the M q-chains share M/(M+1) by their
  normalised weights: the convex combination of the unbiased single-chain estimate and
  the consistent importance estimate, so the chain that made the image is never dropped.

The model enters only through two callables, so the estimators run on a toy without a
network (tests/test_estimators.py) and on any MARPolicy (`policy_callables`):
- logp_fn(states [T+1, M, R, D], rows [R], steps=None) -> [T, M, R] (or [S, M, R] at the
  head steps `steps`): per-transition log-probs under the policy of the given chains for the
  tokens `rows`. `steps` is only passed when the caller asks for it (`logp_steps`).
- sample_fn(noise [T+1, M, R, D], rows [R], branch_from [T+1, R, D]) -> states
  [T+1, M, R, D]: chains drawn by the policy from initial noise noise[0] and step noises
  noise[1:] (needed by `resample` only); under an SDE window they share the rows' rollout
  chain `branch_from` up to the window and branch there (models/chains.py sample_chains).
rows is a flat index into the B * n tokens of the AR step (row-major over [B, n]).

The random draws enter through a third callable, `ChainNoise`: noise(num_states, M, rows, D)
-> standard normals [num_states, M, R, D]. The trainer's (`image_noise`) is a pure function
of each row's image seed, AR step, token position, chain index and head state
(models/noise.py): a token draws the same chains in any batch, on any rank or device, so a
data-parallel shard draws exactly what one process draws for its images. `generator_noise`
draws a whole batch from one torch.Generator (the toy, whose rows are not images).

Call `draw_chains` while the parameters are still theta_old (before the first update of
the rollout): logp_old and the posterior weights are computed under no_grad then, with the
same callable that the loss uses, so the first-pass ratio is exactly 1 and the noise draws
are common to the old and the new policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from margrpo.config import ESTIMATORS
from margrpo.models.noise import FORWARD, RESAMPLE, chain_noise, chain_stream
from margrpo.models.chains import ChainScorer
from margrpo.models.samplers import LOG_2PI, GaussianSampler

LogProbFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SampleFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ChainNoise = Callable[[int, int, torch.Tensor, int], torch.Tensor]
# Streams of the estimators' own chains (the uncertainty map's are noise.UNCERTAINTY).
ESTIMATOR_STREAMS = {"resample": RESAMPLE, "elbo": FORWARD, "posterior": FORWARD}


def image_noise(seeds: torch.Tensor, ar_step: int, positions: torch.Tensor, purpose: int,
                draw: int = 0) -> ChainNoise:
    """Per-image counter draws for the tokens of one AR step.

    seeds: [B] int64 image seeds; positions: [B, n] token positions of the step's layout
    (rows index its row-major flattening). noise(S, M, rows, D)[j, c, r] is the chain-c draw
    of head state j of token positions[b, k] of image b, r = b * n + k, on the stream
    noise.chain_stream(purpose, c, draw); on the device of `positions`.
    """
    n = positions.shape[1]
    seeds = seeds.to(positions.device)

    def draws(num_states: int, num_chains: int, rows: torch.Tensor, dim: int) -> torch.Tensor:
        s, t = seeds[rows // n], positions.reshape(-1)[rows].unsqueeze(1)  # [R], [R, 1]
        return torch.stack([
            chain_noise(s, ar_step, t, num_states, dim, chain_stream(purpose, c, draw))[:, :, 0]
            for c in range(num_chains)
        ], dim=1)

    return draws


def generator_noise(generator: torch.Generator) -> ChainNoise:
    """A whole batch's draws [S, M, R, D] from one CPU generator, in a single call (toys and
    tests; they depend on the batch)."""
    def draws(num_states: int, num_chains: int, rows: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.randn(num_states, num_chains, rows.numel(), dim, generator=generator).to(rows.device)

    return draws


@dataclass
class ChainDraw:
    """Chains of one AR step for the selected tokens (M = 1 for `single`).

    states: [T+1, M, R, D]; states[T] is the committed token for single / elbo / posterior.
    weights: [M, R], sum to 1 over M for every token.
    logp_old: [T, M, R] transition log-probs under the old policy, or [S, M, R] at the head
    steps `logp_steps` only (uniform-weight estimators need no more than the loss steps).
    rows: [R] long, flat index into B * n.
    ess: [R] effective sample size 1 / sum_s w_s^2 (M for uniform weights).
    """

    states: torch.Tensor
    weights: torch.Tensor
    logp_old: torch.Tensor
    rows: torch.Tensor
    ess: torch.Tensor
    logp_steps: torch.Tensor | None = None

    @property
    def num_chains(self) -> int:
        return self.weights.shape[0]


def standard_normal_log_prob(x: torch.Tensor) -> torch.Tensor:
    """log N(x; 0, I) over the last dim: the prior of the initial head state s_0."""
    return -0.5 * x.float().pow(2).sum(-1) - 0.5 * x.shape[-1] * LOG_2PI


def posterior_log_weights(
    states: torch.Tensor, logp_old: torch.Tensor, sampler: GaussianSampler
) -> torch.Tensor:
    """Unnormalised log w_s = log p_old(s_{0:T}) - log q(s_{0:T-1} | s_T): [M, R].

    states [T+1, M, R, D]; logp_old [T, M, R] the policy's transition log-probs on them.
    """
    log_p = standard_normal_log_prob(states[0]) + logp_old.sum(0)
    return log_p - sampler.q_log_prob(states)


def draw_chains(
    estimator: str,
    *,
    sampler: GaussianSampler,
    logp_fn: LogProbFn,
    chain: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    num_chains: int,
    rows: torch.Tensor | None = None,
    noise: ChainNoise | None = None,
    sample_fn: SampleFn | None = None,
    states: torch.Tensor | None = None,
    states_logp: torch.Tensor | None = None,
    logp_steps: torch.Tensor | None = None,
    keep_rollout: bool = False,
) -> ChainDraw:
    """Chains, weights and old log-probs of one AR step for the tokens in `mask`.

    chain: [T+1, B, n, D] rollout chain (chain[T] = committed tokens x0); logp: [T, B, n]
    its recorded log-probs; mask: [B, n] bool selected tokens; num_chains: M (ignored by
    `single`); rows: mask's flat nonzero indices [R] when the caller has them (saves a
    host sync); noise: source of all draws (`ChainNoise`, called once for [T(+1), M, R, D];
    not needed by `single` or by `resample` with `states`).
    states: `resample` only, chains [T+1, M, R, D] already drawn by the old policy from the
    same z (the uncertainty map's chains, reused as the authors do) instead of new draws.
    states_logp: [T, M, R] the old policy's transition log-probs of `states`, recorded when
    they were drawn; saves their recomputation (same values up to float rounding of the
    batch shape, as for the rollout chain). Only with `states`.
    logp_steps: long [S]; for `resample` / `elbo` compute logp_old at these head steps only
    (their weights are uniform, so the loss steps are all they need); ignored by `posterior`,
    whose weights need every transition.
    keep_rollout: `posterior` only: the rollout chain joins as chain 0 (M + 1 chains, see the
    module docstring).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    t_steps, d = chain.shape[0] - 1, chain.shape[-1]
    rows = mask.reshape(-1).nonzero().squeeze(-1) if rows is None else rows
    r = rows.numel()
    x_rows = chain.reshape(t_steps + 1, -1, d)[:, rows]  # [T+1, R, D]
    dev = chain.device
    if estimator == "single":
        ones = torch.ones(1, r, device=dev)
        return ChainDraw(x_rows.unsqueeze(1), ones, logp.reshape(t_steps, -1)[:, rows].unsqueeze(1).float(), rows, ones[0])
    m = int(num_chains)
    if m < 1:
        raise ValueError(f"num_chains must be >= 1, got {num_chains}")
    with torch.no_grad():
        if states_logp is not None and (estimator != "resample" or states is None or states_logp.shape != (t_steps, m, r)):
            raise ValueError(f"states_logp goes with resample `states`, shape {(t_steps, m, r)}; "
                             f"got {tuple(states_logp.shape)} for {estimator!r}")
        if estimator == "resample" and states is not None:
            if states.shape != (t_steps + 1, m, r, d):
                raise ValueError(f"resample states must be {(t_steps + 1, m, r, d)}, got {tuple(states.shape)}")
        elif noise is None:
            raise ValueError(f"the {estimator} estimator draws chains and needs `noise`")
        elif estimator == "resample":
            if sample_fn is None:
                raise ValueError("the resample estimator needs sample_fn")
            states = sample_fn(noise(t_steps + 1, m, rows, d), rows, x_rows)
        else:
            states = sampler.q_chain(x_rows[-1].unsqueeze(0).expand(m, r, d), noise(t_steps, m, rows, d))
        if states_logp is not None:
            logp_old = (states_logp if logp_steps is None else states_logp[logp_steps]).float()
        elif estimator == "posterior" or logp_steps is None:
            logp_steps = None
            logp_old = logp_fn(states, rows).float()
        else:
            logp_old = logp_fn(states, rows, logp_steps).float()
        if estimator == "posterior":
            weights = torch.softmax(posterior_log_weights(states, logp_old, sampler), dim=0)
            if keep_rollout:
                own_logp = logp.reshape(t_steps, -1)[:, rows].unsqueeze(1).float()
                states = torch.cat([x_rows.unsqueeze(1), states], dim=1)
                logp_old = torch.cat([own_logp, logp_old], dim=1)
                weights = torch.cat([torch.full((1, r), 1.0 / (m + 1), device=dev), weights * (m / (m + 1))], dim=0)
        else:
            weights = torch.full((m, r), 1.0 / m, device=dev)
        ess = 1.0 / weights.pow(2).sum(0)
    return ChainDraw(states, weights, logp_old, rows, ess, logp_steps)


def policy_callables(
    scorer: ChainScorer,
    latents: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    z_sample: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[LogProbFn, SampleFn]:
    """(logp_fn, sample_fn) of a policy for the tokens of one AR step, through its scorer
    (the policy, the rollout's guidance scale, the loss's guidance mode).

    latents() -> (z_c, z_u) [B, n, C]: the latents of the scored tokens (the step-i latents
    gathered at the token positions), asked for only when a callable is called (a resample
    draw that reuses recorded chains calls neither). z_sample: optional (z_c, z_u)
    [B, n, C] to DRAW resample chains from (the authors draw from z_fin and score under
    z_i); default: the scoring latents.
    The sampler draws with the guided mean, as at rollout. The M chains of a token share its
    latents (one head call per step for all of them, models/chains.py shared_guided_output).
    """
    def rows_of(z: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return z.reshape(-1, z.shape[-1])[rows]  # [R, C]

    def logp_fn(states: torch.Tensor, rows: torch.Tensor, steps: torch.Tensor | None = None) -> torch.Tensor:
        steps = range(scorer.policy.sampler.num_steps) if steps is None else steps.tolist()
        z_c, z_u = latents()
        lp, _, _ = scorer.log_probs(rows_of(z_c, rows), rows_of(z_u, rows), states, steps)
        return lp

    def sample_fn(noise: torch.Tensor, rows: torch.Tensor, branch_from: torch.Tensor | None = None) -> torch.Tensor:
        zs_c, zs_u = z_sample if z_sample is not None else latents()
        states, _ = scorer.sample(rows_of(zs_c, rows), rows_of(zs_u, rows), noise, branch_from)
        return states

    return logp_fn, sample_fn

"""Bias / variance of the MTE estimators on a linear-Gaussian head chain (method.md §3.2).

Toy: 1-D tokens, DDPMSampler with T = 10 respaced steps and its posterior variance. The
"head" is linear in the state with a scalar parameter theta,
    eps_hat(x, j) = c_j x + b_j theta,
so every transition mean is linear, mean_j = A_j x + B_j theta, and the model's x0 marginal
is Gaussian with closed-form mean and variance (propagated through the T steps).
- c_j = sqrt(1 - abar_j) / (abar_j s0^2 + 1 - abar_j): the optimal predictor for data
  N(0, s0^2). Because the sampler uses the DDPM posterior variance (exact only for a
  point-mass data distribution), the chain is NOT the exact reverse of q. (The exact-reverse
  case must be avoided: there every estimator is exact with zero variance.)
- head "shift" (default): b_j = -kappa std_j / k_eps_j, so theta moves every transition mean
  by kappa * theta step standard deviations; each step adds kappa^2 to the chain Fisher
  information.
- head "datamean": b_j = -c_j sqrt(abar_j), the optimal predictor for data N(theta, s0^2).
  Realistic but harsh: with T = 10 the last two DDPM steps have std ~0.01 while the mean
  still moves with theta, so the chain score is dominated by them (huge variances).

For x0 ~ p_theta (on-policy rollouts) each estimator's gradient estimate of
d log p_theta(x0) / d theta goes through the real code path: `draw_chains` and
`chain_policy_terms` with advantage 1, autograd on a per-row copy of theta. Two independent
draws per x0 give the conditional variance E[Var(est | x0)]; the exact score gives the bias.

probes/estimator_toy.py prints the table (docs/method.md, the multi-trajectory estimators);
tests/test_estimators.py checks the estimators on the same toy.
"""
from __future__ import annotations

import math

import torch

from margrpo.models.samplers import DDPMSampler, gaussian_log_prob
from margrpo.method.estimators import ESTIMATORS, draw_chains, generator_noise
from margrpo.method.losses import chain_policy_terms


class LinearGaussianToy:
    def __init__(self, theta: float = 0.5, s0: float = 0.1, kappa: float = 0.3,
                 head: str = "shift", num_steps: int = 10):
        self.sampler = DDPMSampler(num_steps)
        self.theta = float(theta)
        sp = self.sampler
        abar = sp.abar.double()
        c = (1.0 - abar).sqrt() / (abar * s0**2 + 1.0 - abar)
        if head == "shift":
            b = -kappa * sp.std.double() / sp.k_eps.double()
        elif head == "datamean":
            b = -c * abar.sqrt()
        else:
            raise ValueError(f"head must be 'shift' or 'datamean', got {head!r}")
        self.c, self.b = c.float(), b.float()  # [T] slopes of eps_hat in x and in theta
        # mean_j = k_x x - k_eps eps_hat = A_j x + B_j theta (float64 for the exact marginal)
        self.A = sp.k_x.double() - sp.k_eps.double() * c
        self.B = -sp.k_eps.double() * b

    @property
    def num_steps(self) -> int:
        return self.sampler.num_steps

    def head(self, x: torch.Tensor, j: int, theta: torch.Tensor) -> torch.Tensor:
        """eps_hat for states x [..., D] and theta broadcastable to x."""
        return self.c[j] * x + self.b[j] * theta

    def logp_fn(self, theta_rows: torch.Tensor):
        """logp_fn for draw_chains: theta_rows [R_total] (one copy per row, for per-row grads)."""
        def fn(states: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            th = theta_rows[rows].view(1, -1, 1)  # broadcast over [M, R, D]
            out = []
            for j in range(self.num_steps):
                mean, std = self.sampler.transition(states[j], j, self.head(states[j], j, th))
                out.append(gaussian_log_prob(states[j + 1], mean, std))
            return torch.stack(out)
        return fn

    def sample_fn(self, noise: torch.Tensor, rows: torch.Tensor, branch_from: torch.Tensor | None = None) -> torch.Tensor:
        """Chains under the current theta from noise [T+1, ..., D] (every transition
        stochastic: the toy has no SDE window, so branch_from is not read)."""
        x, states = noise[0], [noise[0]]
        for j in range(self.num_steps):
            x, _, _, _ = self.sampler.step(x, j, self.head(x, j, torch.tensor(self.theta)), noise[j + 1])
            states.append(x)
        return torch.stack(states)

    def rollout(self, n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """n on-policy chains as a [T+1, n, 1, 1] batch (B = n images of one token) and logp [T, n, 1]."""
        noise = torch.randn(self.num_steps + 1, n, 1, 1, generator=generator)
        chain = self.sample_fn(noise, torch.arange(n))
        logp = self.logp_fn(torch.full((n,), self.theta))(chain.reshape(self.num_steps + 1, 1, n, 1), torch.arange(n))
        return chain, logp.reshape(self.num_steps, n, 1)

    def marginal(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact (mean, var) of the model's x0 = s_T, with s_0 ~ N(0, 1); float64, differentiable in theta."""
        mu, var = theta * 0.0, torch.ones((), dtype=torch.float64)
        std = self.sampler.std.double() * self.sampler.temperature
        for j in range(self.num_steps):
            mu = self.A[j] * mu + self.B[j] * theta
            var = self.A[j] ** 2 * var + std[j] ** 2
        return mu, var

    def exact_score(self, x0: torch.Tensor) -> torch.Tensor:
        """d log p_theta(x0) / d theta for x0 [...] (var does not depend on theta)."""
        theta = torch.tensor(self.theta, dtype=torch.float64, requires_grad=True)
        mu, var = self.marginal(theta)
        (dmu,) = torch.autograd.grad(mu, theta)
        return ((x0.double() - mu.detach()) / var * dmu).float()


def estimate(toy: LinearGaussianToy, estimator: str, m: int, chain, logp, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image gradient estimates [B] and ESS [B], through draw_chains + the PPO term."""
    b = chain.shape[1]
    theta_rows = torch.full((b,), toy.theta, requires_grad=True)
    logp_fn = toy.logp_fn(theta_rows)
    mask = torch.ones(b, 1, dtype=torch.bool)
    with torch.no_grad():
        draw = draw_chains(estimator, sampler=toy.sampler, logp_fn=logp_fn, chain=chain, logp=logp,
                           mask=mask, num_chains=m, noise=generator_noise(generator), sample_fn=toy.sample_fn)
    terms, _ = chain_policy_terms(draw, logp_fn(draw.states, draw.rows), torch.ones(b), 0.2, n_tokens=1)
    (g,) = torch.autograd.grad(terms.sum(), theta_rows)
    return -g, draw.ess  # loss = -A * ratio, so the policy-gradient estimate is -dloss


def measure(toy: LinearGaussianToy, estimator: str, m: int, n_x0: int, seed: int) -> dict[str, float]:
    """Bias and conditional variance of one estimator at M = m over n_x0 on-policy x0.

    bias = E[est - score] over x0 ~ p_theta and draws (se: its standard error);
    rms_bias = sqrt(E_x0[(E[est | x0] - score)^2]) from two independent draws per x0;
    cond_var = E_x0[Var(est | x0)] = E[(e1 - e2)^2] / 2. `single` has no draws: its
    conditional variance is E[(est - score)^2] (it is exactly unbiased given x0).
    """
    gen = torch.Generator().manual_seed(seed)
    chain, logp = toy.rollout(n_x0, gen)
    score = toy.exact_score(chain[-1].reshape(-1))
    if estimator == "single":
        e, ess = estimate(toy, estimator, m, chain, logp, gen)
        diff = e - score
        return dict(bias=float(diff.mean()), se=float(diff.std() / math.sqrt(n_x0)),
                    rms_bias=0.0, cond_var=float(diff.pow(2).mean()), ess=float(ess.median()),
                    score_var=float(score.var()))
    chain2 = torch.cat([chain, chain], dim=1)  # two independent draws per x0
    logp2 = torch.cat([logp, logp], dim=1)
    e, ess = estimate(toy, estimator, m, chain2, logp2, gen)
    e1, e2 = e[:n_x0], e[n_x0:]
    diff = 0.5 * (e1 + e2) - score
    cond_var = float(0.5 * (e1 - e2).pow(2).mean())
    ms_bias = float(diff.pow(2).mean()) - cond_var / 2.0
    return dict(bias=float(diff.mean()), se=float(diff.std() / math.sqrt(n_x0)),
                rms_bias=math.sqrt(max(ms_bias, 0.0)), cond_var=cond_var,
                ess=float(ess.median()), score_var=float(score.var()))


def table(n_x0: int = 4000, seed: int = 0, ms=(1, 4, 16, 64), toy: LinearGaussianToy | None = None) -> list[dict]:
    toy = toy or LinearGaussianToy()
    rows = []
    for est in ESTIMATORS:
        for m in ((1,) if est == "single" else ms):
            rows.append(dict(estimator=est, M=m, **measure(toy, est, m, n_x0, seed + 1000 * m)))
    return rows

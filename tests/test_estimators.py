"""The MTE estimators on a linear-Gaussian toy with an exact marginal score (method.md §3.2).

The toy (margrpo/probes/estimator_toy.py) is a 1-D DDPM chain, T = 10, posterior variance, whose
transition means are linear in the state and in theta; it is not the exact reverse of q
(there every estimator would be exact with zero variance). theta moves each transition mean
by kappa * theta step stds, so the chain score is sum_j kappa * noise_j and the chain Fisher
information is T * kappa^2 = 0.9 exactly.

Statistical assertions use a fixed seed and tolerances of >= 4 standard errors (or ratios
far from the measured ones), so they neither pass by chance nor flake. Measured values
(n_x0 = 4000, recorded in the report): single bias ~0, conditional variance 0.45; elbo bias
-0.16 at every M; posterior bias -0.13 / -0.05 / -0.01 at M = 4 / 16 / 64.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from margrpo.models.chains import ChainScorer, sample_chain
from margrpo.models.samplers import DDPMSampler, FlowSDESampler, gaussian_log_prob
from margrpo.method.losses import chain_policy_terms
from margrpo.method.estimators import (
    ESTIMATORS,
    draw_chains,
    generator_noise,
    policy_callables,
    posterior_log_weights,
)
from margrpo.probes.estimator_toy import LinearGaussianToy
from margrpo.probes.estimator_toy import measure as measure_toy


N_X0 = 3000


@pytest.fixture(scope="module")
def toy():
    return LinearGaussianToy(theta=0.5, s0=0.1, kappa=0.3, head="shift")


@pytest.fixture(scope="module")
def stats(toy):
    runs = [("single", 1), ("resample", 16), ("elbo", 1), ("elbo", 16),
            ("posterior", 1), ("posterior", 4), ("posterior", 16), ("posterior", 64)]
    return {(e, m): measure_toy(toy, e, m, N_X0, seed=10 + m) for e, m in runs}


def marginal_fisher(toy) -> float:
    theta = torch.tensor(toy.theta, dtype=torch.float64, requires_grad=True)
    mu, var = toy.marginal(theta)
    (dmu,) = torch.autograd.grad(mu, theta)
    return float(dmu**2 / var)


# ---- the toy itself ------------------------------------------------------------------
def test_toy_marginal_matches_sampling(toy):
    chain, logp = toy.rollout(20000, torch.Generator().manual_seed(0))
    mu, var = toy.marginal(torch.tensor(toy.theta, dtype=torch.float64))
    x0 = chain[-1].reshape(-1).double()
    assert abs(float(x0.mean() - mu)) < 4 * math.sqrt(float(var) / 20000)
    assert abs(float(x0.var() / var) - 1.0) < 4 * math.sqrt(2 / 20000)
    assert logp.shape == (toy.num_steps, 20000, 1)


# ---- unbiasedness / bias / variance --------------------------------------------------
def test_single_is_unbiased_with_the_right_conditional_variance(toy, stats):
    s = stats[("single", 1)]
    assert abs(s["bias"]) < 4 * s["se"]
    # E[(single - score)^2] = chain Fisher - marginal Fisher = T kappa^2 - F
    want = toy.num_steps * 0.3**2 - marginal_fisher(toy)
    assert want > 0.3  # the toy is far from the degenerate exact-reverse case
    assert abs(s["cond_var"] - want) < 0.08 * want


def test_posterior_bias_and_variance_shrink_with_m(stats):
    b = {m: stats[("posterior", m)] for m in (4, 16, 64)}
    assert abs(b[4]["bias"]) > 6 * b[4]["se"]  # SNIS bias is real at small M ...
    assert abs(b[64]["bias"]) < 0.25 * abs(b[4]["bias"])  # ... and vanishes as M grows
    assert abs(b[64]["bias"]) < abs(b[16]["bias"]) < abs(b[4]["bias"])
    assert b[64]["cond_var"] < 0.5 * b[16]["cond_var"] < 0.25 * b[4]["cond_var"]
    assert 1.0 <= b[4]["ess"] < b[16]["ess"] < b[64]["ess"] <= 64


def test_elbo_variance_falls_like_one_over_m_and_its_bias_stays(stats):
    e1, e16 = stats[("elbo", 1)], stats[("elbo", 16)]
    assert 10.0 < e1["cond_var"] / e16["cond_var"] < 25.0  # ~16
    assert abs(e16["bias"]) > 8 * e16["se"]
    assert abs(e16["bias"] - e1["bias"]) < 4 * math.hypot(e1["se"], e16["se"])
    # with one chain the posterior weight is 1: identical draws give identical numbers
    assert stats[("posterior", 1)] == e1


def test_resample_mean_is_zero_on_policy(toy, stats):
    r = stats[("resample", 16)]
    # fresh chains do not end in x0: E[est | x0] = 0, so the bias is minus the score
    assert abs(r["bias"]) < 4 * r["se"]
    fisher = marginal_fisher(toy)
    assert abs(r["rms_bias"] ** 2 / fisher - 1.0) < 0.15
    assert abs(r["cond_var"] / (toy.num_steps * 0.3**2 / 16) - 1.0) < 0.15


# ---- API contracts ---------------------------------------------------------------------
def _setup(toy, b=6, n=4):
    gen = torch.Generator().manual_seed(5)
    chain, logp = toy.rollout(b * n, gen)
    t = toy.num_steps
    chain, logp = chain.reshape(t + 1, b, n, 1), logp.reshape(t, b, n)
    mask = torch.rand(b, n, generator=gen) < 0.5
    theta_rows = torch.full((b * n,), toy.theta, requires_grad=True)
    return chain, logp, mask, theta_rows


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_draw_contracts_first_pass_ratio_one(toy, estimator):
    chain, logp, mask, theta_rows = _setup(toy)
    fn = toy.logp_fn(theta_rows)
    kw = dict(sampler=toy.sampler, logp_fn=fn, chain=chain, logp=logp, mask=mask, num_chains=8,
              sample_fn=toy.sample_fn)
    d = draw_chains(estimator, noise=generator_noise(torch.Generator().manual_seed(1)), **kw)
    m, r = d.weights.shape
    assert r == int(mask.sum()) and m == (1 if estimator == "single" else 8)
    assert torch.equal(d.rows, mask.reshape(-1).nonzero().squeeze(-1))
    assert d.states.shape == (toy.num_steps + 1, m, r, 1) and d.logp_old.shape == (toy.num_steps, m, r)
    assert torch.allclose(d.weights.sum(0), torch.ones(r)) and not d.weights.requires_grad
    assert ((d.ess >= 1 - 1e-5) & (d.ess <= m + 1e-4)).all()
    if estimator != "resample":  # these chains end in the committed token
        x0 = chain[-1].reshape(-1, 1)[d.rows]
        assert torch.equal(d.states[-1], x0.unsqueeze(0).expand(m, r, 1))
    # same parameters: the ratio is exactly 1 and the gradient is sum_s w_s * score_s * A
    new = fn(d.states, d.rows)
    assert torch.allclose(new, d.logp_old, atol=1e-5)
    adv = torch.randn(6)
    terms, st = chain_policy_terms(d, new, adv, 0.2, n_tokens=4)
    assert float(st["clipfrac"]) == 0.0 and abs(float(st["ratio_mean"]) - 1) < 1e-5
    (g,) = torch.autograd.grad(terms.sum(), theta_rows)
    score = torch.autograd.grad(fn(d.states, d.rows).sum(0).mul(d.weights).sum(), theta_rows)[0]
    a_tok = adv.repeat_interleave(4)
    assert torch.allclose(-g, score * a_tok, atol=1e-4)
    # common random numbers: the same generator seed replays the same draws
    d2 = draw_chains(estimator, noise=generator_noise(torch.Generator().manual_seed(1)), **kw)
    assert torch.equal(d.states, d2.states) and torch.equal(d.weights, d2.weights)


def test_posterior_weights_match_manual_computation(toy):
    chain, logp, mask, theta_rows = _setup(toy)
    fn = toy.logp_fn(theta_rows.detach())
    d = draw_chains("posterior", sampler=toy.sampler, logp_fn=fn, chain=chain, logp=logp, mask=mask,
                    num_chains=5, noise=generator_noise(torch.Generator().manual_seed(2)))
    s = d.states.double()
    sp = toy.sampler
    logp_p = torch.distributions.Normal(0.0, 1.0).log_prob(s[0, ..., 0])
    logq = torch.zeros_like(logp_p)
    for j in range(toy.num_steps):
        logp_p = logp_p + d.logp_old[j].double()
        q = torch.distributions.Normal((1 - sp.beta[j].double()).sqrt() * s[j + 1, ..., 0], sp.beta[j].double().sqrt())
        logq = logq + q.log_prob(s[j, ..., 0])
    assert torch.allclose(d.weights.double(), torch.softmax(logp_p - logq, 0), atol=1e-4)
    assert torch.allclose(posterior_log_weights(d.states, d.logp_old, sp).double(), logp_p - logq, atol=1e-2)


def test_flow_sampler_estimators_run():
    sp = FlowSDESampler(8)
    g = torch.Generator().manual_seed(3)
    chain = torch.randn(9, 2, 3, 4, generator=g)

    def fn(states, rows):  # any Gaussian policy: mean = 0.9 * x
        return torch.stack([gaussian_log_prob(states[j + 1], 0.9 * states[j], torch.full(states.shape[1:-1], float(sp.std[j])))
                            for j in range(8)])

    for est in ("elbo", "posterior"):
        d = draw_chains(est, sampler=sp, logp_fn=fn, chain=chain, logp=torch.zeros(8, 2, 3),
                        mask=torch.ones(2, 3, dtype=torch.bool), num_chains=4, noise=generator_noise(g))
        assert torch.isfinite(d.weights).all() and torch.isfinite(d.logp_old).all()
        assert torch.allclose(d.states[-1, 0], chain[-1].reshape(6, 4))


class _TinyPolicy:
    """Just enough of MARPolicy for policy_callables: a linear head on (x, z)."""

    def __init__(self):
        self.sampler = DDPMSampler(5)
        self.w = torch.nn.Parameter(torch.tensor(0.3))

    def head_output(self, x, t, z):
        return self.w * x + z[:, : x.shape[-1]] * (1.0 + t[:, None])


def test_policy_callables_score_what_they_sample():
    pol = _TinyPolicy()
    g = torch.Generator().manual_seed(4)
    z_c, z_u = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    logp_fn, sample_fn = policy_callables(ChainScorer(pol, 2.0), lambda: (z_c, z_u))
    rows = torch.tensor([0, 4, 5])
    noise = torch.randn(6, 2, 3, 2, generator=g)
    with torch.no_grad():
        states = sample_fn(noise, rows)
        _, _, _, lp_ref = sample_chain(pol, z_c.reshape(6, 5)[rows].expand(2, 3, 5),
                                       z_u.reshape(6, 5)[rows].expand(2, 3, 5), noise, 2.0)
    lp = logp_fn(states, rows)
    assert lp.shape == (5, 2, 3) and torch.allclose(lp, lp_ref, atol=1e-5)
    assert lp.requires_grad  # gradient reaches the head parameters through the guided mean


def test_resample_reuses_given_chains_and_scores_only_the_loss_steps():
    """The trainer hands `resample` the uncertainty map's chains and asks for logp_old at the
    loss head steps only; the draw must keep those chains and match a full recompute there."""
    pol = _TinyPolicy()
    g = torch.Generator().manual_seed(7)
    z_c, z_u = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    logp_fn, sample_fn = policy_callables(ChainScorer(pol, 2.0), lambda: (z_c, z_u))
    mask = torch.tensor([[True, False, True], [False, True, True]])
    rows = mask.reshape(-1).nonzero().squeeze(-1)
    with torch.no_grad():
        given = sample_fn(torch.randn(6, 3, rows.numel(), 2, generator=g), rows)
    chain, logp = torch.zeros(6, 2, 3, 2), torch.zeros(5, 2, 3)
    steps = torch.tensor([1, 3])
    d = draw_chains("resample", sampler=pol.sampler, logp_fn=logp_fn, chain=chain, logp=logp, mask=mask,
                    num_chains=3, states=given, logp_steps=steps)
    assert torch.equal(d.states, given) and torch.equal(d.logp_steps, steps)
    with torch.no_grad():
        full = logp_fn(given, rows)
    assert d.logp_old.shape == (2, 3, rows.numel()) and torch.allclose(d.logp_old, full[steps], atol=1e-6)
    adv = torch.randn(2)
    terms, st = chain_policy_terms(d, logp_fn(d.states, d.rows, steps), adv, 0.2, n_tokens=3, head_steps=steps)
    assert terms.shape == (2, 3, rows.numel()) and float(st["clipfrac"]) == 0.0
    with pytest.raises(ValueError, match="logp_steps"):
        chain_policy_terms(d, full, adv, 0.2, n_tokens=3)
    with pytest.raises(ValueError, match="resample states"):
        draw_chains("resample", sampler=pol.sampler, logp_fn=logp_fn, chain=chain, logp=logp, mask=mask,
                    num_chains=4, states=given)
    # Log-probs recorded while drawing the chains replace the recompute: same values.
    with torch.no_grad():
        _, _, _, drawn_lp = sample_chain(pol, z_c.reshape(6, 5)[rows].expand(3, -1, -1),
                                         z_u.reshape(6, 5)[rows].expand(3, -1, -1),
                                         torch.randn(6, 3, rows.numel(), 2, generator=g), 2.0)
    rec_states = sample_fn(torch.randn(6, 3, rows.numel(), 2, generator=torch.Generator().manual_seed(1)), rows)
    with torch.no_grad():
        _, _, _, rec_lp = sample_chain(pol, z_c.reshape(6, 5)[rows].expand(3, -1, -1),
                                       z_u.reshape(6, 5)[rows].expand(3, -1, -1),
                                       torch.randn(6, 3, rows.numel(), 2, generator=torch.Generator().manual_seed(1)), 2.0)
    dr = draw_chains("resample", sampler=pol.sampler, logp_fn=logp_fn, chain=chain, logp=logp, mask=mask,
                     num_chains=3, states=rec_states, states_logp=rec_lp, logp_steps=steps)
    with torch.no_grad():
        assert torch.allclose(dr.logp_old, logp_fn(rec_states, rows, steps), atol=1e-5)
    assert not torch.allclose(drawn_lp[steps], dr.logp_old, atol=1e-3)  # other chains, other values
    with pytest.raises(ValueError, match="states_logp goes with resample"):
        draw_chains("resample", sampler=pol.sampler, logp_fn=logp_fn, chain=chain, logp=logp, mask=mask,
                    num_chains=3, states=rec_states, states_logp=rec_lp[:, :2], logp_steps=steps)
    # posterior needs every transition for its weights: logp_steps is ignored there
    dp = draw_chains("posterior", sampler=pol.sampler, logp_fn=logp_fn, chain=chain, logp=logp, mask=mask,
                     num_chains=3, noise=generator_noise(torch.Generator().manual_seed(0)), logp_steps=steps)
    assert dp.logp_steps is None and dp.logp_old.shape[0] == pol.sampler.num_steps


# ---- resample's selected-token term on the base model's real tokens ----------------------
def test_resample_term_on_selected_tokens_is_biased_and_independent_chains_are_not():
    """probes/resample_bias.py at a small size on the committed base (2 images x 192 draws
    of M = 4 chains per committed token, mar_grpo's top-k). Scoring the chains that ranked
    the tokens gives the selected tokens a mean score far from 0 (its squared norm measured
    2.2x what a zero-mean term gives here; the ratio grows with the draws, 1.3x at 64),
    pointing against the unselected tokens' (mean cosine -0.34); the same tokens scored by
    independent chains from the same latents stay near zero-mean (1.2x)."""
    from margrpo.config import load_params
    from margrpo.models.loading import load_model
    from margrpo.probes import resample_bias as bias

    root = Path(__file__).resolve().parents[1]
    params = load_params(root / "params.yaml", {"runtime.device": "cpu"})
    policy = load_model(root / params.model.checkpoint, params)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small matmuls: one thread is the fastest, the more so on a busy machine
    try:
        res = bias.measure(policy, params, ["a red circle", "two blue squares"], torch.tensor([11, 12]), draws=192)
    finally:
        torch.set_num_threads(threads)
    every = res["rows"]["all"]
    reused, fresh = every["selected"]["ratio"], every["selected, independent chains"]["ratio"]
    assert every["selected"]["tokens"] >= 16
    assert reused > 1.4 and reused > fresh + 0.5, every
    assert 0.6 < fresh < 1.4, every
    # The unselected term anti-correlates with the selected one (cos -0.19 on the 8x8 world's
    # base, below -0.2 on the 4-shape world's).
    assert every["unselected"]["ratio"] > 1.2 and every["cos"] < -0.1, every

"""Unit tests of the RL math: advantages, PPO/KL terms, aggregation, selection, log-probs."""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from margrpo.models.samplers import DDPMSampler, FlowSDESampler, gaussian_log_prob
from margrpo.method.advantages import group_advantages, zero_std_fraction
from margrpo.training.gradprobe import group_halves, pair_stats, params_grad, two_estimates, variance_ratio
from margrpo.models.samplers import gaussian_kl_same_std as gaussian_kl
from margrpo.method.losses import ppo_clipped_term, ratio_stats, token_terms, transition_sum
from margrpo.method.selection import (
    consistency_keep,
    loss_token_mask,
    topk_count,
    topk_mask,
    uncertainty_map,
)


# ---- advantages ----------------------------------------------------------------------
def test_advantages_zero_mean_per_group_and_zero_for_constant_group():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5, 7.0, -1.0, 2.0, 3.0])
    gid = torch.tensor([3, 3, 3, 3, 9, 9, 9, 9, 0, 0, 0, 0])  # non-contiguous labels
    a = group_advantages(r, gid)
    for g in gid.unique():
        assert abs(float(a[gid == g].mean())) < 1e-6
    assert torch.equal(a[gid == 9], torch.zeros(4))
    # sample (unbiased) std, as torch.std / Flow-GRPO
    g3 = r[:4]
    assert torch.allclose(a[:4], (g3 - g3.mean()) / (g3.std() + 1e-4))
    assert float(zero_std_fraction(r, gid)) == pytest.approx(1 / 3)


def test_advantages_groups_interleaved_and_singleton():
    r = torch.tensor([1.0, 10.0, 3.0, 20.0, 5.0])
    gid = torch.tensor([0, 1, 0, 1, 2])  # group 2 has one member
    a = group_advantages(r, gid)
    assert a[0] < 0 < a[2] and a[1] < 0 < a[3]
    assert float(a[4]) == 0.0 and torch.isfinite(a).all()


# ---- PPO term, KL, aggregation -------------------------------------------------------
def test_first_pass_ratio_is_one_and_gradient_is_reinforce():
    logp = torch.randn(5, 3, requires_grad=True)
    adv = torch.randn(3)
    w = torch.rand(5, 3)
    loss = ppo_clipped_term(logp, logp.detach(), adv, 0.2, weight=w)
    st = ratio_stats(logp, logp, 0.2)
    assert torch.allclose(loss, -(adv * w))
    assert not st["approx_kl"].requires_grad
    assert float(st["clipfrac"]) == 0.0 and float(st["approx_kl"]) == 0.0 and float(st["ratio_mean"]) == 1.0
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert torch.allclose(g, -(adv * w))


def test_clipping_stops_gradient_outside_trust_region():
    old = torch.zeros(4)
    new = torch.tensor([0.5, 0.5, -0.5, -0.5], requires_grad=True)  # ratio 1.65 / 0.61
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss = ppo_clipped_term(new, old, adv, 0.2)
    st = ratio_stats(new, old, 0.2)
    (g,) = torch.autograd.grad(loss.sum(), new)
    # A>0 & ratio>1+c, A<0 & ratio<1-c: clipped, no gradient; the other two keep theirs
    assert g[0] == 0 and g[3] == 0 and g[1] != 0 and g[2] != 0
    assert float(st["clipfrac"]) == 1.0
    r = torch.exp(new.detach())
    assert float(st["approx_kl"]) == pytest.approx(float(((r - 1) - new.detach()).mean()))


def test_gaussian_kl_zero_and_matches_torch():
    g = torch.Generator().manual_seed(0)
    m1, m2 = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    std = torch.rand(6, generator=g) + 0.1
    assert torch.equal(gaussian_kl(m1, m1, std), torch.zeros(6))
    ref = kl_divergence(Normal(m1, std[:, None]), Normal(m2, std[:, None])).sum(-1)
    assert torch.allclose(gaussian_kl(m1, m2, std), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sampler", [DDPMSampler(20), FlowSDESampler(20)], ids=["ddpm", "flow"])
def test_step_log_prob_matches_torch_normal(sampler):
    g = torch.Generator().manual_seed(1)
    for j in range(sampler.num_steps):
        x, out, noise = (torch.randn(7, 3, generator=g) for _ in range(3))
        x_next, mean, std, lp = sampler.step(x, j, out, noise)
        ref = Normal(mean, std[:, None]).log_prob(x_next).sum(-1)
        assert torch.allclose(lp, ref, rtol=1e-5, atol=1e-4), j
        other = torch.randn(7, 3, generator=g)
        assert torch.allclose(gaussian_log_prob(other, mean, std), Normal(mean, std[:, None]).log_prob(other).sum(-1),
                              rtol=1e-5, atol=1e-3)


def test_transition_sum_weighs_every_scored_transition_once():
    # one AR step, S=2 head steps, B=2 images, n=3 tokens
    t = torch.tensor([[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [[3.0, 4.0, 5.0], [6.0, 7.0, 8.0]]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    per_image = transition_sum(t, mask)
    assert per_image.tolist() == [1.0 + 2.0 + 3.0 + 4.0, 0.0]
    (g,) = torch.autograd.grad(per_image.sum(), t)
    # each masked transition gets weight 1, masked-out ones none: a token of a step that
    # commits two tokens weighs what a token of a step that commits six does
    assert torch.equal(g, mask.float().expand(2, 2, 3))


def test_token_terms_places_each_token_set_and_zero_elsewhere():
    # S=2 head steps, B=2 images, L=3 tokens: rollout-chain terms of tokens 0 and 3, the
    # summed M=4 chain terms of tokens 1 and 5, token 2 and 4 in neither set
    own = torch.arange(1.0, 13.0).view(2, 2, 3).requires_grad_()
    single = torch.tensor([[True, False, False], [True, False, False]])
    chains = torch.ones(2, 4, 2) * torch.tensor([1.0, 2.0]).view(1, 1, 2)
    terms = token_terms(own, single, [(torch.tensor([1, 5]), chains.sum(1))])
    assert terms[0].tolist() == [[1.0, 4.0, 0.0], [4.0, 0.0, 8.0]]
    assert terms[1].tolist() == [[7.0, 4.0, 0.0], [10.0, 0.0, 8.0]]
    (g,) = torch.autograd.grad(terms.sum(), own)
    assert torch.equal(g, single.float().expand(2, 2, 3))
    # a non-finite own term outside `single` neither reaches the terms nor the gradient
    own2 = own.detach().clone()
    own2[:, :, 2] = float("inf")
    own2.requires_grad_()
    (g2,) = torch.autograd.grad(token_terms(own2, single).sum(), own2)
    assert torch.isfinite(token_terms(own2, single)).all() and torch.equal(g2, single.float().expand(2, 2, 3))


# ---- selection -----------------------------------------------------------------------
def test_uncertainty_map_is_variance_over_chains():
    x = torch.randn(5, 2, 3, 4)
    u = uncertainty_map(x)
    assert u.shape == (2, 3)
    assert torch.allclose(u, x.var(0, unbiased=False).mean(-1))
    assert torch.equal(uncertainty_map(x[:1]), torch.zeros(2, 3))


@pytest.mark.parametrize("k", [0.0, 0.1, 0.3, 0.5, 0.77, 1.0])
@pytest.mark.parametrize("n", [1, 7, 10, 64])
def test_topk_selects_ceil_k_n_per_image(k, n):
    u = torch.rand(3, n, generator=torch.Generator().manual_seed(n))
    m = topk_mask(u, k)
    want = math.ceil(round(k * n, 9))
    assert m.sum(-1).tolist() == [want] * 3
    if 0 < want < n:  # selected ones are the most uncertain
        assert (u[m].view(3, want).min(-1).values >= u.masked_fill(m, -1).max(-1).values).all()


def test_topk_float_noise_ties_and_candidates():
    assert topk_count(0.3, 10) == 3 and topk_count(0.3, 20) == 6
    m = topk_mask(torch.zeros(1, 5), 0.4)  # all tied: lowest indices win
    assert m.tolist() == [[True, True, False, False, False]]
    cand = torch.tensor([[False, True, True, True, False]])
    m = topk_mask(torch.tensor([[9.0, 1.0, 3.0, 2.0, 8.0]]), 0.5, candidates=cand)
    assert m.tolist() == [[False, False, True, True, False]]  # ceil(0.5*3) = 2 of the candidates


def test_consistency_rules_on_hand_made_vectors():
    final = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]])
    spec_prev = torch.tensor([[[0.0, 1.0], [1.0, 0.1], [0.0, 1.0], [-1.0, -1.0]]])
    spec_i = torch.tensor([[[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [-1.0, -1.0]]])
    # cos_i:    0.707, 0.707, 0,     -1
    # cos_prev: 0,     0.995, 1,     -1
    none = torch.zeros(1, 4, dtype=torch.bool)
    assert consistency_keep(spec_i, final, 0.0, "paper", none).tolist() == [[True, True, False, False]]
    assert consistency_keep(spec_i, final, 0.5, "paper", none).tolist() == [[True, True, False, False]]
    assert consistency_keep(spec_i, final, 0.0, "code", none, spec_prev).tolist() == [[True, False, False, False]]
    # step 0 under the code rule falls back to the paper rule (previous cos taken as 0)
    assert consistency_keep(spec_i, final, 0.0, "code", none).tolist() == [[True, True, False, False]]
    committed = torch.tensor([[False, False, False, True]])
    assert consistency_keep(spec_i, final, 0.0, "paper", committed)[0, 3]
    with pytest.raises(ValueError):
        consistency_keep(spec_i, final, 0.0, "nope", none)


def test_loss_token_mask_scopes():
    committed = torch.tensor([[True, False, False, False]])
    keep = torch.tensor([[True, True, False, True]])
    known = torch.tensor([[False, False, False, True]])
    assert loss_token_mask(committed, keep, "committed").tolist() == [[True, False, False, False]]
    assert loss_token_mask(committed, keep, "committed+speculative", known).tolist() == [[True, True, False, False]]
    with pytest.raises(ValueError):
        loss_token_mask(committed, keep, "all")


# ---- gradient probe ------------------------------------------------------------------
def test_gradprobe_two_estimates():
    w = torch.tensor([1.0, -2.0, 0.5], requires_grad=True)
    unused = torch.zeros(2, requires_grad=True)

    def loss_fn(gen, scale=1.0):
        noise = scale * torch.randn(3, generator=gen)
        return ((w + noise) * w).sum()  # grad = 2w + noise

    g1, g2, st = two_estimates(loss_fn, [w, unused], seeds=(3, 4))
    assert g1.shape == (5,) and torch.equal(g1[3:], torch.zeros(2, dtype=torch.float64))
    assert not torch.equal(g1, g2) and -1.0 <= st["cosine"] <= 1.0
    same = pair_stats(g1, g1)
    assert same["cosine"] == pytest.approx(1.0) and same["noise_var"] == 0.0
    _, _, quiet = two_estimates(lambda g: loss_fn(g, 0.01), [w, unused], seeds=(3, 4))
    assert variance_ratio(quiet, st) == pytest.approx(1e-4, rel=1e-3)
    assert torch.allclose(params_grad((w * w).sum(), [w]), 2 * w.detach().double())
    assert w.grad is None


def test_pair_stats_per_parameter_equal_those_of_the_flat_vectors():
    """The trainer's probe hands pair_stats a model's gradients as they are, one tensor per
    parameter (no float64 copy of the whole model): the same numbers as the flat vectors."""
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    b = [x + 0.5 * torch.randn(x.shape, generator=g) for x in a]
    flat = pair_stats(*(torch.cat([x.reshape(-1) for x in v]).double() for v in (a, b)))
    parts = pair_stats(a, b)
    assert parts == pytest.approx(flat, rel=1e-12)
    assert 0.5 < parts["cosine"] < 1.0 and parts["snr"] > 0
    with pytest.raises(ValueError, match="parts"):
        pair_stats(a, b[:1])


def _gaussian_policy_halves(shuffle: bool, batches: int = 200, p: int = 64, prompts: int = 8,
                            group: int = 8, seed: int = 0) -> tuple[float, float]:
    """Mean (snr, cosine) of the two half-batch policy gradients of a Gaussian policy
    a ~ N(theta, I) in R^p with reward u . a (+ noise), group advantages, REINFORCE loss.
    The expected gradient is known (along u), so the probe's sign is checkable."""
    gen = torch.Generator().manual_seed(seed)
    theta = torch.zeros(p, requires_grad=True)
    u = torch.zeros(p)
    u[0] = 1.0
    groups = torch.arange(prompts).repeat_interleave(group)
    halves = group_halves(groups)
    snr, cos = [], []
    for _ in range(batches):
        a = theta.detach() + torch.randn(prompts * group, p, generator=gen)
        r = a @ u + 0.5 * torch.randn(prompts * group, generator=gen)
        adv = group_advantages(r, groups)
        if shuffle:
            adv = adv[torch.randperm(adv.numel(), generator=gen)]
        g = [params_grad(-(adv * -0.5 * (a - theta).pow(2).sum(-1) * w).sum() / w.sum(), [theta])
             for w in (halves.float(), (~halves).float())]
        st = pair_stats(*g)
        snr.append(st["snr"])
        cos.append(st["cosine"])
    return sum(snr) / batches, sum(cos) / batches


def test_group_split_snr_is_positive_with_signal_and_zero_without():
    snr, cos = _gaussian_policy_halves(shuffle=False)  # measured 0.355, 0.249
    assert snr > 0.3 and cos > 0.2, (snr, cos)  # |E g|^2 / noise of one half-batch
    snr0, cos0 = _gaussian_policy_halves(shuffle=True)  # measured 0.024, 0.010
    assert abs(snr0) < 0.05 and abs(cos0) < 0.05, (snr0, cos0)


"""The SDE window (issue 39): deterministic head transitions outside a window of stochastic
ones, the loss on the window only, and the extra chains branching from the rollout chain."""
from __future__ import annotations

import pytest
import torch

from margrpo.config import ParamsError
from margrpo.method.plan import plan_tokens, speculative_steps_needed, uncertainty_chains_needed
from margrpo.models.chains import ChainScorer, gather_rows, guided_output, recompute_log_probs
from margrpo.models.harmon.sampler import HarmonDDPMSampler
from margrpo.models.loading import new_model
from margrpo.models.samplers import DDPMSampler, FlowSDESampler
from margrpo.training.loop import train_step
from margrpo.training.trainer import Batch, Trainer
from margrpo.world.grammar import VOCAB
from margrpo.world.prompts import make_prompt_set

from conftest import RedReward, randomize_head, tiny_params

PROMPTS = make_prompt_set("train", 2, seed=0)


def _noised(sampler, j, x0, eps):
    """The training marginal of head state j for a clean x0 and noise eps, and the exact head
    output there (velocity eps - x0 for flow, eps for DDPM)."""
    if isinstance(sampler, FlowSDESampler):
        s = float(sampler.sigmas[j])
        return (1 - s) * x0 + s * eps, eps - x0
    if isinstance(sampler, HarmonDDPMSampler):
        a = 1.0 / float(sampler.sqrt_recip_abar[sampler.num_steps - 1 - j]) ** 2
    else:
        a = float(sampler.abar[j])
    return a**0.5 * x0 + (1 - a) ** 0.5 * eps, eps


def _next_marginal(sampler, j, x0, eps):
    if isinstance(sampler, FlowSDESampler):
        s = float(sampler.sigmas[j + 1])
        return (1 - s) * x0 + s * eps
    if isinstance(sampler, HarmonDDPMSampler):
        a = float(sampler.sqrt_abar_prev[sampler.num_steps - 1 - j]) ** 2
    else:
        a = float(sampler.abar_next[j])
    return a**0.5 * x0 + (1 - a) ** 0.5 * eps


@pytest.mark.parametrize("sampler", [FlowSDESampler(20, shift=3.0), DDPMSampler(20), HarmonDDPMSampler(20)],
                         ids=["flow", "ddpm", "harmon"])
def test_deterministic_step_stays_on_the_noising_path_of_an_exact_head(sampler):
    """With the head output exact for (x0, eps), the ODE / DDIM step maps the state at noise
    level j to the state at level j + 1 of the same (x0, eps): the deterministic step keeps
    the marginals; it records std 0 and log-prob 0. The clean prediction returns x0."""
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(64, 4, generator=g), torch.randn(64, 4, generator=g)
    for j in (1, 7, 18):
        x, out = _noised(sampler, j, x0, eps)
        x_next, _, std, lp = sampler.step(x, j, out, torch.randn(64, 4, generator=g), stochastic=False)
        assert torch.allclose(x_next, _next_marginal(sampler, j, x0, eps), atol=2e-4), j
        assert not std.any() and not lp.any()
        assert torch.allclose(sampler.clean_prediction(x, j, out), x0, atol=2e-4), j


def test_windowed_rollout_is_deterministic_outside_the_window_and_scores_inside():
    torch.manual_seed(0)
    policy = randomize_head(new_model(tiny_params(), VOCAB))
    prompts = [m["prompt"] for m in PROMPTS[:6]]
    seeds = torch.arange(6)
    window = (1, 2)  # of the 4 head transitions of the tiny model
    ro = policy.rollout(prompts, seeds=seeds, sde_steps=window)
    assert ro.sde_steps == window
    t = policy.sampler.num_steps
    for st in ro.steps:
        outside = [j for j in range(t) if j not in window]
        assert not st.std[outside].any() and not st.logp[outside].any()
        assert (st.std[list(window)] > 0).all()
    # the window's log-probs recompute exactly (ratio 1 at theta_old)
    for i, st in enumerate(ro.steps):  # one AR step at a time: they commit different counts
        lp = recompute_log_probs(policy, ro, ar_steps=[i], head_steps=list(window))[0]
        assert torch.allclose(lp, st.logp[list(window)], atol=1e-5)
    # the images differ from the all-stochastic chain's, yet replay bit for bit
    again = policy.rollout(prompts, seeds=seeds, sde_steps=window)
    assert torch.equal(again.images, ro.images)
    assert not torch.equal(policy.rollout(prompts, seeds=seeds).images, ro.images)
    # a scorer refuses the deterministic transitions (they have no density)
    with pytest.raises(ValueError, match="deterministic"):
        ChainScorer(policy, ro.cfg_scale, sde_steps=window).log_probs(None, None, ro.steps[0].chain, [0, 1])


def test_extra_chains_branch_from_the_rollout_chain_at_the_window():
    """Extra chains share the rollout chain's states up to the window, branch in it, and stop
    at its end: the states after it hold the clean prediction from the window's last state."""
    torch.manual_seed(0)
    policy = randomize_head(new_model(tiny_params(), VOCAB))
    prompts = [m["prompt"] for m in PROMPTS[:4]]
    window = (1, 2)  # of 4 transitions: branch at state 1, stop at state 3
    ro = policy.rollout(prompts, seeds=torch.arange(4), extra_chains=3, extra_chain_steps=[0, 1], sde_steps=window)
    plain = policy.rollout(prompts, seeds=torch.arange(4), sde_steps=window)
    assert torch.equal(ro.images, plain.images)  # the extra chains never change the image
    st = ro.steps[0]
    assert st.extra_chain.shape == (5, 3, *st.chain.shape[1:])
    for c in range(3):
        assert torch.equal(st.extra_chain[:2, c], st.chain[:2])  # shared prefix
        assert not torch.equal(st.extra_chain[2, c], st.chain[2])  # branched
    assert not st.extra_logp[[0, 3]].any() and (st.extra_logp[list(window)] != 0).all()
    with torch.no_grad():  # state 4 (after the window's end, state 3) is the clean prediction from state 3
        z_c, z_u = policy.encode(ro, 0)
        zc, zu = gather_rows(z_c, st.commit_idx), gather_rows(z_u, st.commit_idx)
        for c in range(3):
            out = guided_output(policy, st.extra_chain[3, c], 3, zc, zu, ro.cfg_scale)
            clean = policy.sampler.clean_prediction(st.extra_chain[3, c], 3, out)
            assert torch.allclose(st.extra_chain[4, c], clean, atol=1e-5)


def _windowed(method="mar_grpo", **over):
    """A tiny trainer with a 2-transition window (of 4); mar_grpo on `resample` (the tiny
    params' posterior estimator needs the whole chain)."""
    params = tiny_params(**{"train.sde_window": 2, "methods.mar_grpo.estimator": "resample", **over})
    torch.manual_seed(0)
    policy = randomize_head(new_model(params, VOCAB))
    return Trainer(policy, params, params.method(method), 0, PROMPTS, RedReward())


@pytest.mark.parametrize("estimator", ["single", "resample"])
def test_first_pass_ratio_is_one_on_the_window(estimator):
    tr = _windowed(**{"methods.mar_grpo.estimator": estimator})
    metas, groups = tr.sample_batch()
    ar, heads, window = tr.plan_steps()
    assert len(window) == 2 and all(h.tolist() == list(window) for h in heads)
    m_unc, unc_steps = uncertainty_chains_needed(tr.method, ar)
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar),
                           extra_chains=m_unc, extra_chain_steps=unc_steps, sde_steps=window)
    adv = torch.randn(len(metas))
    plans = plan_tokens(tr.scorer(ro), ro, ar, heads, tr.method)
    stats = tr.compute_grads(Batch(groups, ro, adv, adv, plans, 0.0))
    assert stats["diag/approx_kl"] == 0.0 and stats["diag/clipfrac"] == 0.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.ar_params)


def test_window_modes_place_the_window():
    span = tiny_params().train.loss_head_window
    fixed = _windowed(**{"train.sde_window_mode": "fixed", "train.sde_window_start": 1})
    assert fixed.plan_steps()[2] == (1, 2)
    rand = _windowed(**{"train.sde_window_mode": "random"})
    starts = {rand.plan_steps()[2][0] for _ in range(60)}
    assert starts == set(range(span - 1))  # every start within the eligible transitions
    slide = _windowed(**{"train.sde_window_mode": "sliding", "train.steps": 5})
    seen = []
    for step in range(5):
        slide.step = step
        seen.append(slide.plan_steps()[2][0])
    assert seen[0] == 0 and seen[-1] == span - 2 and seen == sorted(seen)


def test_a_windowed_training_step_runs_and_moves_the_weights():
    tr = _windowed("grpo")
    before = [p.detach().clone() for p in tr.ar_params]
    metrics = train_step(tr)[0]
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if k.startswith("loss/"))
    assert any(not torch.equal(a, p) for a, p in zip(before, tr.ar_params))


def test_config_refuses_a_window_the_method_cannot_use():
    with pytest.raises(ParamsError, match="posterior"):  # the tiny params' mar_grpo
        tiny_params(**{"train.sde_window": 2})
    with pytest.raises(ParamsError, match="eligible"):
        tiny_params(**{"train.sde_window": 50, "methods.mar_grpo.sde_window": 0})
    # a method may keep the whole chain while the others use the window
    p = tiny_params(**{"train.sde_window": 2, "methods.mar_grpo.estimator": "posterior",
                       "methods.mar_grpo.sde_window": 0})
    assert p.train_for("mar_grpo").sde_window == 0 and p.train_for("grpo").sde_window == 2


@pytest.mark.parametrize("window", [None, (1, 2)])
def test_pathwise_images_reproduce_the_rollout_and_carry_gradient(window):
    """The probes' differentiable rollout draws the rollout's own images (same order, noise,
    window), and the dense colour reward's gradient reaches the transformer."""
    from margrpo.probes.pathwise import pathwise_images
    from margrpo.world.colour_reward import ColourShareReward

    torch.manual_seed(0)
    policy = randomize_head(new_model(tiny_params(), VOCAB))
    metas = PROMPTS[:5]
    prompts, seeds = [m["prompt"] for m in metas], torch.arange(5) * 7
    with torch.no_grad():
        ref = policy.rollout(prompts, seeds=seeds, sde_steps=window).images
    images = pathwise_images(policy, prompts, seeds, window)
    assert torch.allclose(images, ref, atol=1e-5)
    ColourShareReward()(images, prompts, metas).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.ar_parameters())


def test_colour_share_reward_reads_the_named_colours():
    """1 for an object drawn in the named colour (plain or striped shade), near 0 in another,
    0 for an empty canvas; free-colour prompts score the most used colour's share."""
    from margrpo.world.colour_reward import ColourShareReward
    from margrpo.world.grammar import COLORS
    from margrpo.world.render import STRIPE_DARKNESS

    r = ColourShareReward()
    img = torch.ones(4, 3, 8, 8)
    red, blue = torch.tensor(COLORS["red"]), torch.tensor(COLORS["blue"])
    img[0, :, 2:6, 2:6] = red[:, None, None]
    img[1, :, 2:6, 2:6] = (red * STRIPE_DARKNESS)[:, None, None]
    img[2, :, 2:6, 2:6] = blue[:, None, None]
    img[3, :, 2:4, 2:6] = red[:, None, None]
    img[3, :, 4:6, 2:6] = blue[:, None, None]
    wants_red = {"include": [{"class": "square", "count": 1, "color": "red"}]}
    free = {"include": [{"class": "square", "count": 1, "color": None}]}
    v = r(img, [""] * 4, [wants_red, wants_red, wants_red, free])
    assert v[0] > 0.9 and v[1] > 0.9 and v[2] < 0.01
    assert 0.45 < v[3] < 0.5  # half red, half blue: the most used colour has half the ink
    assert r(torch.ones(1, 3, 8, 8), [""], [wants_red])[0] < 1e-6

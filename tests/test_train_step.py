"""The training step's own contracts: an immutable token plan that splits the loss tokens
between the rollout chain and the multi-trajectory chains, one loss normaliser, and the
non-finite guard of Trainer.train_step."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from margrpo.rl.trainer import NonFiniteError

from test_trainer import make_trainer


def _chosen(plan) -> torch.Tensor:
    """[B, L] bool: the tokens of plan.draw."""
    chosen = torch.zeros(plan.mask.numel(), dtype=torch.bool)
    if plan.draw is not None:
        chosen[plan.draw.rows] = True
    return chosen.view_as(plan.mask)


def test_token_plan_is_built_complete_and_splits_its_loss_tokens():
    tr = make_trainer(**{"methods.mar_grpo.estimator": "resample"})  # top-k, speculative tokens
    plans = tr.collect().plans
    for p in plans:
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.draw = None
        assert p.draw is not None and "select/topk_frac" in p.stats  # filled in when built
        chosen = _chosen(p)
        assert not (p.single & chosen).any()  # a loss token is scored by one of the two
        assert torch.equal(p.single | chosen, p.mask)  # and every loss token by one
    n_chosen, n_loss = (sum(int(f(p).sum()) for p in plans) for f in (_chosen, lambda p: p.mask))
    assert 0 < n_chosen < n_loss  # top-k: some of the loss tokens, not all
    assert all(torch.equal(p.single, p.mask) for p in make_trainer("grpo").collect().plans)  # single: all


@pytest.mark.parametrize("estimator", ["single", "posterior"])
def test_first_pass_loss_weighs_every_scored_transition_alike(estimator):
    """At theta_old every ratio is 1 and the chain weights of a token sum to 1, so every
    scored transition of image b adds -A_b: loss/policy = -sum_b A_b x (scored transitions
    of b) / (B images x committed transition slots per image). Speculative tokens add
    transitions, not slots."""
    tr = make_trainer(**{"methods.mar_grpo.estimator": estimator, "train.beta_kl": 0.0})
    batch = tr.collect()
    adv = torch.randn(len(batch.adv), generator=torch.Generator().manual_seed(0))
    stats = tr.compute_grads(batch, adv=adv)
    scored = sum(p.mask.sum(1).double() * len(p.head_steps) for p in batch.plans)  # [B]
    slots = sum(p.n_committed * len(p.head_steps) for p in batch.plans)
    assert sum(int(p.mask[:, p.n_committed:].sum()) for p in batch.plans) > 0  # speculative tokens scored
    want = -(adv.double() * scored).sum() / (len(adv) * slots)
    assert stats["loss/policy"] == pytest.approx(float(want), rel=1e-5, abs=1e-7)
    assert stats["loss/kl"] == 0.0


def test_an_update_that_makes_the_weights_non_finite_raises():
    tr = make_trainer("grpo")

    def nan_after_step(opt, args, kwargs):
        with torch.no_grad():
            tr.ar_params[0].view(-1)[0] = float("nan")

    tr.opt.register_step_post_hook(nan_after_step)
    with pytest.raises(NonFiniteError, match="made the weights non-finite"):
        tr.train_step()

"""The training step's own contracts: an immutable token plan that splits the loss tokens
between the rollout chain and the multi-trajectory chains, one loss normaliser, the
non-finite guard of Trainer.update, and what keeps the step cheap (the uncertainty
chains drawn with the rollout, a head conditioning shared by the chains of a token, a few
host reads per step)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from margrpo.training.loop import train_step
from margrpo.models.chains import guided_output, shared_guided_output
from margrpo.hostsync import read_all
from margrpo.method.plan import plan_tokens, uncertainty_chains_needed
from margrpo.training.stepstats import plan_stats, stat_tensors
from margrpo.training.trainer import NonFiniteError

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
    for p, stats in zip(plans, plan_stats(plans, read_all(stat_tensors(plans)))):
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.draw = None
        assert p.draw is not None and p.topk_counts is not None  # filled in when built
        assert "select/topk_frac" in stats and "select/ess" in stats
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
        train_step(tr)[0]


# ---- step cost: the uncertainty chains drawn with the rollout, host reads ----------------
PAPER = {"methods.mar_grpo.estimator": "resample", "methods.mar_grpo.token_scope": "committed",
         "methods.mar_grpo.consistency": False}  # mar_grpo of params.yaml on the tiny model


def test_the_rollouts_extra_chains_are_the_uncertainty_chains_the_plan_would_draw():
    """The rollout draws the uncertainty map's M chains beside its own (shared transformer
    pass and head conditioning): the image does not change, and the plan built from them
    selects the same tokens and reuses the same chains as a plan that draws them itself."""
    tr = make_trainer(**PAPER)
    metas, _ = tr.sample_batch()
    ar, heads, _ = tr.plan_steps()
    m, steps = uncertainty_chains_needed(tr.method, ar)
    assert m == tr.method.num_trajectories > 1 and steps == ar
    prompts, seeds = [x["prompt"] for x in metas], torch.arange(len(metas)) * 7919
    with_extra = tr.policy.rollout(prompts, seeds=seeds, extra_chains=m, extra_chain_steps=steps)
    plain = tr.policy.rollout(prompts, seeds=seeds)
    assert torch.equal(with_extra.images, plain.images)
    assert with_extra.steps[ar[0]].extra_chain.shape[:2] == (tr.policy.sampler.num_steps + 1, m)
    assert all(st.extra_chain is None for st in plain.steps)
    fused = plan_tokens(tr.scorer(with_extra), with_extra, ar, heads, tr.method)
    drawn = plan_tokens(tr.scorer(plain), plain, ar, heads, tr.method)
    stats_fused, stats_drawn = (plan_stats(p, read_all(stat_tensors(p))) for p in (fused, drawn))
    for a, b, sa, sb in zip(fused, drawn, stats_fused, stats_drawn):
        assert torch.equal(a.draw.rows, b.draw.rows) and a.draw.rows.numel() > 0
        assert torch.allclose(a.draw.states, b.draw.states, atol=1e-5)
        assert torch.allclose(a.draw.logp_old, b.draw.logp_old, atol=1e-4)
        assert sa and sa == pytest.approx(sb, rel=1e-5)


def test_shared_head_output_matches_the_head_on_expanded_latents(tiny_model):
    """K chains of a row share its head conditioning (TinyMAR's head_condition) and give
    what the head gives on the latents repeated K times; a policy without the split falls
    back to exactly that."""
    g = torch.Generator().manual_seed(0)
    r, k, c, d = 12, 3, tiny_model.head.cond_proj.in_features, tiny_model.token_dim
    z_c, z_u = torch.randn(r, c, generator=g), torch.randn(r, c, generator=g)
    x = torch.randn(k, r, d, generator=g)
    want = guided_output(tiny_model, x, 2, z_c.expand(k, r, c), z_u.expand(k, r, c), 3.0, "guided_full")
    got, cond = shared_guided_output(tiny_model, x, 2, z_c, z_u, 3.0, "guided_full")
    assert cond is not None and torch.allclose(got, want, atol=1e-6)
    again, _ = shared_guided_output(tiny_model, x.flip(0), 2, z_c, z_u, 3.0, "guided_full", cond=cond)
    assert torch.allclose(again, want.flip(0), atol=1e-6)

    class Unsplit:  # the head_output of TinyMAR only (an adapter without the split)
        sampler, guide = tiny_model.sampler, None

        def head_output(self, *args):
            return tiny_model.head_output(*args)

    plain, none = shared_guided_output(Unsplit(), x, 2, z_c, z_u, 3.0, "guided_full")
    assert none is None and torch.allclose(plain, want, atol=1e-6)


def test_host_counter_counts_reads_of_device_values_only():
    from margrpo.hostsync import HostSyncCounter

    dev = torch.ones(3, device="cpu")  # made outside the block: a device tensor
    with HostSyncCounter(code_dir=Path(__file__).parent) as c:
        host = torch.randperm(4, generator=torch.Generator().manual_seed(0))  # a CPU draw by design
        host.tolist(), int(host[0]), host.sort().values.tolist()
        moved = host.to(dev.device)  # moved to the run's device
        moved.sum().item(), float(dev.sum()), dev[dev > 0], dev.nonzero(), bool((dev > 0).all())
        dev.cpu().tolist()  # one copy to the host; the copy is then a host tensor
    assert c.total == 6 and all(site.startswith("test_train_step.py:") for site in c.sites), c.sites
    with HostSyncCounter() as c:  # the default: reads of margrpo's code only
        float(dev.sum())
    assert c.total == 0


def test_a_training_step_reads_the_device_a_few_times_whatever_the_model_size():
    """Every statistic of a step is read in one host sync per group: no read per parameter,
    none per AR step in the loss (tiny trainer; reads counted by margrpo.hostsync)."""
    from margrpo.hostsync import HostSyncCounter

    counts = {}
    for method, over in (("grpo", {}), ("mar_grpo", PAPER)):
        tr = make_trainer(method, **over)
        train_step(tr)[0]
        with HostSyncCounter([t for pol in (tr.policy, tr.ref) for t in vars(pol.sampler).values()
                              if torch.is_tensor(t)]) as c:
            train_step(tr)[0]
        counts[method] = c
    n_params, n_loss_steps = len(list(tr.policy.parameters())), tr.tcfg.loss_ar_steps
    assert counts["grpo"].total <= 10 < n_params, counts["grpo"].sites
    # mar_grpo adds the selected tokens' indices (one read per loss AR step) and one plan read
    assert counts["mar_grpo"].total <= counts["grpo"].total + n_loss_steps + 1, counts["mar_grpo"].sites
    assert all(max(c.sites.values()) <= n_loss_steps for c in counts.values())  # nothing per parameter


def test_read_all_reads_groups_of_tensors_in_one_go():
    from margrpo.hostsync import read_all

    got = read_all({"a": [torch.tensor(1.5), torch.tensor([2, 3])], "b": [], "c": [torch.tensor(True)]})
    assert got == {"a": [1.5, [2.0, 3.0]], "b": [], "c": [1.0]}


def test_state_copies_the_weights_to_the_host():
    tr = make_trainer("grpo")
    train_step(tr)
    state = tr.state()
    params = dict(tr.policy.named_parameters())
    for name, v in state["policy"].items():
        assert v.device.type == "cpu" and torch.equal(v, params[name].detach())
        assert v.data_ptr() != params[name].data_ptr()  # a copy, not a view of the weights


def test_the_loop_lets_the_last_batch_go_before_it_collects_the_next(tmp_path):
    """No two batches (rollouts with every chain) are alive at once: the loop drops the
    previous batch before collect, and keeps the last one for the selection maps."""
    import gc
    import weakref

    from margrpo.training.loop import train

    tr = make_trainer("mar_grpo", **{**PAPER, "train.steps": 3, "train.eval_every": 0, "train.grad_probe_every": 0})
    rollouts, alive = [], []
    collect = tr.collect

    def watch():
        gc.collect()
        alive.append([r() is not None for r in rollouts])
        batch = collect()
        rollouts.append(weakref.ref(batch.rollout))
        return batch

    tr.collect = watch
    train(tr, tmp_path, progress=False)
    assert alive == [[], [False], [False, False]]
    assert (tmp_path / "selection_examples.pt").exists()  # from the last batch


def test_float32_matmuls_use_tf32_on_cuda_only():
    from margrpo.models.device import fast_float32_matmul

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        fast_float32_matmul(torch.device("cpu"))
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        fast_float32_matmul(torch.device("cuda"))  # a flag of torch's: set without a GPU too
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved

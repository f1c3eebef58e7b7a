"""Trainer contracts: ratio 1 on the first pass, frozen head, resume == uninterrupted, NaN guard."""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from margrpo.training.loop import train_step
from margrpo.models.chains import gather_rows, sample_chain
from margrpo.models.loading import new_model
from margrpo.training.gradprobe import flat_grad
from margrpo.training.loop import NonFiniteError, train
from margrpo.method.plan import plan_tokens, speculative_steps_needed
from margrpo.training.trainer import Batch, Trainer
from margrpo.world.grammar import VOCAB
from margrpo.world.prompts import make_prompt_set

from conftest import RedReward, randomize_head, tiny_params

PROMPTS = make_prompt_set("train", 2, seed=0)


def make_trainer(method="mar_grpo", seed=0, **over):
    params = tiny_params(**over)
    torch.manual_seed(0)
    policy = randomize_head(new_model(params, VOCAB))
    return Trainer(policy, params, params.method(method), seed, PROMPTS, RedReward())


@pytest.mark.parametrize("estimator", ["single", "resample", "elbo", "posterior"])
def test_first_pass_ratio_is_one_and_gradient_flows(estimator):
    tr = make_trainer(**{"methods.mar_grpo.estimator": estimator})
    metas, groups = tr.sample_batch()
    ar, heads, _ = tr.plan_steps()
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar))
    adv = torch.randn(len(metas))
    plans = plan_tokens(tr.scorer(ro), ro, ar, heads, tr.method)
    stats = tr.compute_grads(Batch(groups, ro, adv, adv, plans, 0.0))
    assert stats["diag/approx_kl"] == 0.0 and stats["diag/clipfrac"] == 0.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.ar_params)
    # frozen head: no gradient at all
    assert all(p.grad is None for p in tr.head_params)


def test_vanilla_grpo_trains_the_head():
    tr = make_trainer("grpo")
    assert all(p.requires_grad for p in tr.head_params)
    before = [p.detach().clone() for p in tr.head_params]
    train_step(tr)[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.head_params))


def test_kl_is_zero_against_itself():
    tr = make_trainer(**{"train.beta_kl": 1.0})
    m = train_step(tr)[0]
    assert m["loss/kl"] == 0.0  # first step: policy == reference
    m2 = train_step(tr)[0]
    assert m2["loss/kl"] > 0.0


def _run(tmp: Path, base: Path, params, crash_at=None, reward=None):
    def log(step, metrics):
        if crash_at is not None and step == crash_at:
            raise KeyboardInterrupt  # a kill between checkpoints
    tr = Trainer.from_params(params, "mar_grpo", 0, PROMPTS, checkpoint=str(base), reward=reward or RedReward())
    return train(tr, tmp, log=log, progress=False)


def test_resume_matches_uninterrupted_bitwise(tmp_path):
    params = tiny_params(**{"train.steps": 5, "train.checkpoint_every": 2})
    base = tmp_path / "base"
    torch.manual_seed(0)
    randomize_head(new_model(params, VOCAB)).save_pretrained(base)
    full = _run(tmp_path / "full", base, params)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "killed", base, params, crash_at=3)  # checkpoint at 2, killed in 3
    ck = torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=False)
    assert ck["step"] == 2
    resumed = _run(tmp_path / "killed", base, params)
    from safetensors.torch import load_file

    wa = load_file(full / "diffusion_pytorch_model.safetensors")
    wb = load_file(resumed / "diffusion_pytorch_model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    hist = [json.loads(l) for l in (tmp_path / "killed" / "history.jsonl").read_text().splitlines()]
    assert [h["step"] for h in hist] == [1, 2, 3, 4, 5]


def test_nonfinite_steps_are_skipped_then_stop(tmp_path):
    params = tiny_params(**{"train.steps": 6, "train.checkpoint_every": 1, "train.max_nonfinite_in_row": 2})
    base = tmp_path / "base"
    randomize_head(new_model(params, VOCAB)).save_pretrained(base)

    class NaNAfter2(RedReward):
        calls = 0

        def __call__(self, images, prompts, metadata):
            NaNAfter2.calls += 1
            r = super().__call__(images, prompts, metadata)
            return r * float("nan") if NaNAfter2.calls > 2 else r

    with pytest.raises(NonFiniteError, match=r"last good checkpoint is .*ckpt.pt \(step 3\)"):
        _run(tmp_path / "run", base, params, reward=NaNAfter2())
    ck = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert ck["step"] == 3 and ck["nonfinite"][0] == 1  # step 3 skipped and saved; step 4 stops
    assert all(torch.isfinite(v).all() for v in ck["policy"].values())


def test_method_learning_rate_overrides_train_lr():
    over = {"methods.mar_grpo.lr": 3e-4, "train.lr": 1e-5}
    params = tiny_params(**over)
    assert (params.train_for("mar_grpo").lr, params.train_for("grpo").lr) == (3e-4, 1e-5)  # resolved there
    assert [g["lr"] for g in make_trainer(**over).opt.param_groups] == [3e-4]
    assert [g["lr"] for g in make_trainer("grpo", **over).opt.param_groups] == [1e-5]


def test_steps_factor_multiplies_train_steps_for_that_method_only():
    params = tiny_params(**{"methods.grpo.steps_factor": 3, "train.steps": 5})
    assert params.train_for("grpo").steps == 15 and params.train_for("mar_grpo").steps == 5
    assert params.train_for("mar_grpo") is params.train and params.train.steps == 5
    assert make_trainer("grpo", **{"methods.grpo.steps_factor": 3, "train.steps": 5}).tcfg.steps == 15


def test_batch_factor_and_schedule_apply_to_that_method_only():
    over = {"methods.grpo.batch_factor": 2, "methods.grpo.lr_schedule": "cosine", "methods.grpo.warmup_frac": 0.25,
            "methods.grpo.steps_factor": 2, "train.steps": 4, "train.lr": 1e-3}
    params = tiny_params(**over)
    t = params.train_for("grpo")
    assert (t.steps, t.prompts_per_step, t.lr_schedule, t.warmup_steps) == (
        8, 2 * params.train.prompts_per_step, "cosine", 2)
    assert params.train_for("mar_grpo") is params.train and params.train.lr_schedule == "constant"
    tr = make_trainer("grpo", **over)
    metas, groups = tr.sample_batch()
    assert len(metas) == len(groups) == t.prompts_per_step * t.group_size
    # warm-up over 2 of the 8 steps (x (step+1)/2), under a cosine over all 8 that ends near 0
    lrs = [tr.sched.get_last_lr()[0]]
    for _ in range(7):
        tr.opt.step()
        tr.sched.step()
        lrs.append(tr.sched.get_last_lr()[0])
    expect = [1e-3 * min(1.0, (i + 1) / 2) * 0.5 * (1 + math.cos(math.pi * i / 8)) for i in range(8)]
    assert lrs == pytest.approx(expect, rel=1e-9)
    assert lrs[1] == max(lrs) and lrs[-1] < 0.04 * lrs[1]


def test_method_probe_interval_applies_to_that_method_and_leaves_training_alone():
    over = {"train.grad_probe_every": 1, "methods.grpo.grad_probe_every": 0}
    params = tiny_params(**over)
    assert params.train_for("grpo").grad_probe_every == 0 and params.train_for("mar_grpo").grad_probe_every == 1
    probed, quiet = make_trainer("grpo", **{"train.grad_probe_every": 1}), make_trainer("grpo", **over)
    for _ in range(2):
        a, b = train_step(probed)[0], train_step(quiet)[0]
        assert "probe/snr" in a and not any(k.startswith("probe/") for k in b)
        assert a["reward/mean"] == b["reward/mean"] and a["loss/policy"] == b["loss/policy"]
    assert all(torch.equal(x, y) for x, y in zip(probed.policy.parameters(), quiet.policy.parameters()))


@pytest.mark.parametrize("beta_kl", [0.01, 0.0])
def test_paired_base_logs_the_base_reward_on_the_same_batch_and_leaves_training_alone(beta_kl):
    plain = make_trainer("grpo", **{"train.beta_kl": beta_kl})
    paired = make_trainer("grpo", **{"train.beta_kl": beta_kl, "methods.grpo.paired_base": True})
    for step in range(3):
        a, b = train_step(plain)[0], train_step(paired)[0]
        assert "reward/base_mean" not in a
        # the same rewards and weights as without the base rollout (no generator touched)
        assert a["reward/mean"] == b["reward/mean"] and a["loss/policy"] == b["loss/policy"]
        if step == 0:  # nothing trained yet: the base is the policy, on the same draws
            assert b["reward/base_mean"] == b["reward/mean"] and b["reward/vs_base"] == 0.0
        else:  # the policy moved, the base did not
            assert b["reward/base_mean"] != b["reward/mean"]
            assert b["reward/vs_base"] == pytest.approx(b["reward/mean"] - b["reward/base_mean"])
    assert all(torch.equal(x, y) for x, y in zip(plain.policy.parameters(), paired.policy.parameters()))


@pytest.mark.parametrize("scope", ["loss", "committed"])
def test_mte_scope_limits_the_multi_trajectory_tokens(scope):
    tr = make_trainer(**{"methods.mar_grpo.mte_scope": scope, "methods.mar_grpo.token_scope": "committed+speculative",
                         "methods.mar_grpo.topk_pool": "ar_step", "k": 0.5})
    metas, _ = tr.sample_batch()
    ar, heads, _ = tr.plan_steps()
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar))
    plans = plan_tokens(tr.scorer(ro), ro, ar, heads, tr.method)
    spec_selected = 0
    for plan in plans:
        n_commit, n_all = plan.n_committed, plan.mask.shape[1]
        col = plan.draw.rows % n_all
        spec_selected += int((col >= n_commit).sum())
        committed_rows = int(plan.mask[:, :n_commit].sum())
        if scope == "committed":  # ceil(k * n) of each image's committed tokens, no speculative one
            assert int((col < n_commit).sum()) == plan.mask.shape[0] * math.ceil(0.5 * n_commit)
        assert committed_rows > 0
    assert (spec_selected == 0) == (scope == "committed")


def test_loss_head_window_keeps_loss_steps_among_the_noisiest():
    window = 4
    tr = make_trainer(**{"sampling.head_steps": 8, "train.loss_head_window": window, "train.loss_head_steps": 3})
    seen = set()
    for _ in range(20):
        ar, heads, _ = tr.plan_steps()
        for h in heads:
            assert len(h) == 3 and len(set(h.tolist())) == 3
            seen.update(h.tolist())
    assert seen == set(range(window))  # every eligible step gets drawn, none later


def _pathwise_redness_gradient(policy, prompts: list[str], gen: torch.Generator) -> None:
    """Accumulate into .grad the reparameterised gradient of the mean redness. TinyMAR.rollout
    runs without autograd and fills its canvas in place, so the rollout is written out again
    here, differentiably (same schedule, random order, fixed noise): back-propagated through
    every head step and through the canvas into later AR steps. Being a second, independent
    implementation is the point of the check."""
    b, n, d, t = len(prompts), policy.num_tokens, policy.token_dim, policy.sampler.num_steps
    ids = policy.tokenize(prompts)
    order = torch.stack([torch.randperm(n, generator=gen) for _ in range(b)])
    canvas, known, start = torch.zeros(b, n, d), torch.zeros(b, n, dtype=torch.bool), 0
    for count in policy.schedule:
        z_c, z_u = policy.encode_pair(ids, canvas, known)
        idx = order[:, start : start + count]
        noise = torch.randn(t + 1, b, count, d, generator=gen)
        chain, *_ = sample_chain(policy, gather_rows(z_c, idx), gather_rows(z_u, idx), noise, policy.cfg_scale)
        canvas = canvas.scatter(1, idx.unsqueeze(-1).expand(-1, -1, d), chain[-1])
        known = known.scatter(1, idx, True)
        start += count
    RedReward()(policy.decode_tokens(canvas), prompts, None).mean().backward()


@pytest.mark.parametrize("method, control", [("grpo", False), ("mar_grpo", True)])
def test_policy_gradient_matches_the_pathwise_gradient(method, control):
    """End to end, the trainer's loss gradient estimates the gradient of the expected
    reward: summed over 150 batches (19200 images) of rollout -> rewards -> group
    advantages -> log-probs -> loss, it aligns with the reparameterised gradient of the same
    expected reward (a differentiable reward here, so that this exact gradient exists). A
    sign error or a reward credited to the wrong image, token or AR step breaks the
    alignment. The control negates the advantages on the same batches: a part of the
    gradient that does not follow the advantages (an artifact of the loss) would keep its
    sign, so real > 0.5 together with control < -0.5 says the alignment comes from the
    rewards. (A shuffled-advantage control was tried first: its cosine, zero in expectation,
    ranged -0.28..0.51 over seeds and batch orders, too wide to separate from 0.68-0.95.)
    CFG scale 1: with w = 3 the estimate is several times noisier (the null branch enters
    with weight 1 - w)."""
    params = tiny_params(**{
        "model.sampler": "flow", "model.flow_shift": 3.0, "sampling.cfg_scale": 1.0, "train.cfg_null_grad": True,
        "sampling.num_ar_steps": 2, "train.loss_ar_steps": 2, "train.loss_head_steps": 4,
        "train.prompts_per_step": 8, "train.group_size": 16, "train.beta_kl": 0.0,
        "methods.mar_grpo.estimator": "single", "methods.mar_grpo.topk": False,
        "methods.mar_grpo.consistency": False, "methods.mar_grpo.token_scope": "committed"})
    torch.manual_seed(0)
    policy = new_model(params, VOCAB)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # larger random head weights than randomize_head: visible colours
        for p in policy.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    tr = Trainer(policy, params, params.method(method), 0, PROMPTS, RedReward())
    trained = [p for group in tr.opt.param_groups for p in group["params"]]

    def flat() -> torch.Tensor:
        return flat_grad([p.grad for p in trained], trained)

    gen = torch.Generator().manual_seed(1)
    pool = [m["prompt"] for m in PROMPTS]
    tr.opt.zero_grad(set_to_none=True)
    _pathwise_redness_gradient(policy, [pool[i] for i in torch.randint(len(pool), (1024,), generator=gen)], gen)
    exact = flat()
    estimate, negated = torch.zeros_like(exact), torch.zeros_like(exact)
    for _ in range(150):
        batch = tr.collect()
        for total, adv in ((estimate, batch.adv), (negated, -batch.adv))[: 1 + control]:
            tr.compute_grads(batch, adv=adv)
            total -= flat()  # the loss gradient points downhill
    cos = [torch.nn.functional.cosine_similarity(g, exact, dim=0).item() for g in (estimate, negated)]
    assert cos[0] > 0.5 and (not control or cos[1] < -0.5), cos


def test_topk_selects_the_fraction_k_of_each_images_loss_tokens_on_the_study_config():
    """With the study's sampling and MAR-GRPO settings (tiny widths), top-k picks
    ceil(k n) of each image's n loss tokens, pooled over its loss AR steps: a fraction
    near k, not every committed token."""
    from margrpo.config import load_params

    small = {f"model.{k}": v for k, v in {"width": 32, "depth": 1, "heads": 2, "cond_dim": 32,
                                          "head_width": 32, "head_depth": 1}.items()}
    params = load_params("params.yaml", {**small, "train.prompts_per_step": 2, "train.group_size": 2})
    torch.manual_seed(0)
    tr = Trainer.from_params(params, "mar_grpo", 0, PROMPTS, policy=randomize_head(new_model(params, VOCAB)),
                             reward=RedReward())
    batch = tr.collect()
    # candidates per image: its loss tokens (only the committed ones with mte_scope committed)
    loss_tokens = sum(p.mask[:, : (p.n_committed if tr.method.mte_scope == "committed" else None)].sum(1)
                      for p in batch.plans)
    selected = torch.zeros_like(loss_tokens)
    for p in batch.plans:
        n_tok = p.mask.shape[1]
        selected += torch.bincount(p.draw.rows // n_tok, minlength=len(loss_tokens))
    want = torch.tensor([math.ceil(round(params.k * int(n), 9)) for n in loss_tokens])
    assert torch.equal(selected, want)
    frac = float(selected.sum() / loss_tokens.sum())
    assert abs(frac - params.k) < 0.1 and frac < 1.0


def test_posterior_keeps_the_rollout_chain_as_one_of_its_draws():
    tr = make_trainer(**{"methods.mar_grpo.estimator": "posterior", "methods.mar_grpo.token_scope": "committed",
                         "methods.mar_grpo.consistency": False, "num_trajectories": 3})
    batch = tr.collect()
    for p in batch.plans:
        d = p.draw
        b, n = p.mask.shape
        own = p.blocks[0].chain.reshape(p.blocks[0].chain.shape[0], b * n, -1)[:, d.rows]
        assert torch.equal(d.states[:, 0], own)  # chain 0 is the chain that made the image
        assert torch.allclose(d.weights[0], torch.full_like(d.weights[0], 1 / 4))
        assert torch.allclose(d.weights.sum(0), torch.ones(d.rows.numel()))


def test_reference_copies_only_the_trained_parameters_and_checkpoints_hold_only_those():
    tr = make_trainer("mar_grpo", **{"train.beta_kl": 0.1})  # frozen head
    ref_params = dict(tr.ref.named_parameters())
    for name, p in tr.policy.named_parameters():
        shared = ref_params[name] is p
        assert shared == name.startswith("head."), name  # the frozen head is shared, the rest copied
    assert sorted(tr.state()["policy"]) == sorted(n for n, _ in tr.policy.named_parameters()
                                                  if not n.startswith("head."))
    grpo = make_trainer("grpo", **{"train.beta_kl": 0.1})  # trains the head: nothing shared
    assert not any(a is b for a, b in zip(grpo.ref.parameters(), grpo.policy.parameters()))


def test_truncated_checkpoint_names_the_file_and_history_stays_strict_json(tmp_path):
    params = tiny_params(**{"train.steps": 2, "train.checkpoint_every": 1})
    base = tmp_path / "base"
    randomize_head(new_model(params, VOCAB)).save_pretrained(base)
    run = tmp_path / "run"
    _run(run, base, params)
    for line in (run / "history.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    data = (run / "ckpt.pt").read_bytes()
    (run / "ckpt.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(Exception, match=r"ckpt\.pt.*\n.*delete it to restart"):
        _run(run, base, params.model_copy(update={"train": params.train.model_copy(update={"steps": 3})}))


def test_bfloat16_forward_passes_keep_float32_rewards_advantages_and_loss():
    tr = make_trainer(**{"runtime.dtype": "bfloat16"})
    tr.policy.set_precision(torch.bfloat16)  # what load_model does with runtime.dtype
    metrics, batch = train_step(tr)
    assert batch.rewards.dtype == batch.adv.dtype == torch.float32
    assert all(p.draw.logp_old.dtype == torch.float32 for p in batch.plans)
    assert all(math.isfinite(metrics[k]) for k in ("loss/policy", "loss/kl", "diag/grad_norm_ar"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_step_keeps_its_tensors_on_the_gpu_and_follows_the_cpu_step():
    """The same step on both devices: the same batch and draws (counter-based, per image),
    so rewards agree to float rounding and the updates stay close."""
    params = tiny_params()
    torch.manual_seed(0)
    policy = randomize_head(new_model(params, VOCAB))
    gpu_policy = copy.deepcopy(policy).cuda()
    before = flat_grad(list(policy.parameters()), list(policy.parameters()))
    cpu, gpu = (Trainer(p, params, params.method("mar_grpo"), 0, PROMPTS, RedReward()) for p in (policy, gpu_policy))
    (a, _), (b, batch) = train_step(cpu), train_step(gpu)
    assert batch.rewards.is_cuda and batch.adv.is_cuda and batch.groups.is_cuda
    assert all(p.draw.states.is_cuda and p.mask.is_cuda for p in batch.plans)
    assert b["reward/mean"] == pytest.approx(a["reward/mean"], abs=1e-4)
    # The updates point the same way (other draws would give a cosine far below 1; a few
    # components with gradients near Adam's eps may still differ by up to lr).
    moves = [flat_grad([q.detach().cpu() for q in t.policy.parameters()], list(policy.parameters())) - before
             for t in (cpu, gpu)]
    assert torch.nn.functional.cosine_similarity(*moves, dim=0) > 0.99


def test_batches_are_stratified_by_purpose():
    tr = make_trainer(**{"train.prompts_per_step": 4})
    purposes = {m.get("tag") or m.get("category") for m in PROMPTS}
    assert len(purposes) >= 4
    for _ in range(5):
        metas, groups = tr.sample_batch()
        firsts = metas[:: tr.tcfg.group_size]
        assert len({m.get("tag") or m.get("category") for m in firsts}) == 4  # four different purposes
        assert torch.equal(groups, torch.arange(4).repeat_interleave(tr.tcfg.group_size))


def test_probe_compares_speculative_tokens_on_the_same_rollouts():
    spec = {"methods.spec.freeze_head": True, "methods.spec.token_scope": "committed+speculative",
            "methods.spec.consistency": True,
            "train.grad_probe_every": 1, "train.prompts_per_step": 2}
    tr = make_trainer("spec", **spec)
    m = train_step(tr)[0]
    for key in ("probe/snr", "probe/snr_committed", "probe/snr_unfiltered", "probe/cos_groups"):
        assert math.isfinite(m[key]), key
    assert m["probe/snr"] != m["probe/snr_committed"]  # the speculative terms change the gradient

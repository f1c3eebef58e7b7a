"""Trainer contracts: ratio 1 on the first pass, frozen head, resume == uninterrupted, NaN guard."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from margrpo.models.chains import gather_rows, sample_chain
from margrpo.models.loading import new_model
from margrpo.rl.gradprobe import flat_grad
from margrpo.rl.policy_loss import prepare, speculative_steps_needed
from margrpo.rl.trainer import NonFiniteError, Trainer, train
from margrpo.world.prompts import make_prompt_set

from conftest import RedReward, randomize_head, tiny_params

PROMPTS = make_prompt_set("train", 2, seed=0)


def make_trainer(method="mar_grpo", seed=0, **over):
    params = tiny_params(**over)
    torch.manual_seed(0)
    policy = randomize_head(new_model(params))
    return Trainer(policy, params, params.method(method), seed, PROMPTS, RedReward())


@pytest.mark.parametrize("estimator", ["single", "resample", "elbo", "posterior"])
def test_first_pass_ratio_is_one_and_gradient_flows(estimator):
    tr = make_trainer(**{"methods.mar_grpo.estimator": estimator})
    metas, groups = tr.sample_batch()
    ar, heads = tr.plan_steps()
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar))
    adv = torch.randn(len(metas))
    plans = prepare(tr.policy, ro, ar, heads, tr.method, "guided", torch.Generator().manual_seed(1))
    stats = tr.compute_grads(ro, plans, adv)
    assert stats["diag/approx_kl"] == 0.0 and stats["diag/clipfrac"] == 0.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.ar_params)
    # frozen head: no gradient at all
    assert all(p.grad is None for p in tr.head_params)


def test_vanilla_grpo_trains_the_head():
    tr = make_trainer("grpo")
    assert all(p.requires_grad for p in tr.head_params)
    before = [p.detach().clone() for p in tr.head_params]
    tr.train_step()
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.head_params))


def test_kl_is_zero_against_itself():
    tr = make_trainer(**{"train.beta_kl": 1.0})
    m = tr.train_step()
    assert m["loss/kl"] == 0.0  # first step: policy == reference
    m2 = tr.train_step()
    assert m2["loss/kl"] > 0.0


def _run(tmp: Path, base: Path, params, crash_at=None):
    def log(step, metrics):
        if crash_at is not None and step == crash_at:
            raise KeyboardInterrupt  # a kill between checkpoints
    return train(params, "mar_grpo", 0, tmp, base_checkpoint=base, train_prompts=PROMPTS, log=log, progress=False)


def test_resume_matches_uninterrupted_bitwise(tmp_path):
    params = tiny_params(**{"train.steps": 5, "train.checkpoint_every": 2})
    base = tmp_path / "base"
    torch.manual_seed(0)
    randomize_head(new_model(params)).save_pretrained(base)
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
    randomize_head(new_model(params)).save_pretrained(base)

    class NaNAfter2(RedReward):
        calls = 0

        def __call__(self, images, prompts, metadata):
            NaNAfter2.calls += 1
            r = super().__call__(images, prompts, metadata)
            return r * float("nan") if NaNAfter2.calls > 2 else r

    from margrpo.rewards import base as rb

    rb._REGISTRY["test_red"], old = (lambda **kw: NaNAfter2()), rb._REGISTRY["test_red"]
    try:
        with pytest.raises(NonFiniteError, match="last good checkpoint"):
            _run(tmp_path / "run", base, params)
    finally:
        rb._REGISTRY["test_red"] = old
    ck = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)
    assert ck["step"] == 3 and ck["nonfinite"][0] == 1  # step 3 skipped and saved; step 4 stops
    assert all(torch.isfinite(v).all() for v in ck["policy"].values())


def test_method_learning_rate_overrides_train_lr():
    tr = make_trainer(**{"methods.mar_grpo.lr": 3e-4, "train.lr": 1e-5})
    assert [g["lr"] for g in tr.opt.param_groups] == [3e-4]
    assert [g["lr"] for g in make_trainer("grpo", **{"train.lr": 1e-5}).opt.param_groups] == [1e-5]


@pytest.mark.parametrize("scope", ["loss", "committed"])
def test_mte_scope_limits_the_multi_trajectory_tokens(scope):
    tr = make_trainer(**{"methods.mar_grpo.mte_scope": scope, "methods.mar_grpo.token_scope": "committed+speculative",
                         "k": 0.5})
    metas, _ = tr.sample_batch()
    ar, heads = tr.plan_steps()
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar))
    plans = prepare(tr.policy, ro, ar, heads, tr.method, "guided", torch.Generator().manual_seed(1))
    spec_selected = 0
    for plan in plans:
        n_commit, n_all = plan.groups[0][0].shape[1], plan.mask.shape[1]
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
        ar, heads = tr.plan_steps()
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
        z_c, z_u = policy._encode_pair(ids, canvas, known)
        idx = order[:, start : start + count]
        noise = torch.randn(t + 1, b, count, d, generator=gen)
        chain, *_ = sample_chain(policy, gather_rows(z_c, idx), gather_rows(z_u, idx), noise, policy.cfg_scale)
        canvas = canvas.scatter(1, idx.unsqueeze(-1).expand(-1, -1, d), chain[-1])
        known = known.scatter(1, idx, True)
        start += count
    RedReward()(policy.unpatchify(canvas), prompts, None).mean().backward()


@pytest.mark.parametrize("method, shuffle", [("grpo", False), ("mar_grpo", False), ("mar_grpo", True)])
def test_policy_gradient_matches_the_pathwise_gradient(method, shuffle):
    """End to end, the trainer's loss gradient estimates the gradient of the expected
    reward: summed over 150 batches (19200 images) of rollout -> rewards -> group
    advantages -> log-probs -> loss, it aligns with the reparameterised gradient of the same
    expected reward (a differentiable reward here, so that this exact gradient exists). A
    sign error or a reward credited to the wrong image, token or AR step breaks the
    alignment; the shuffled-advantage control shows the check can fail. Measured over
    seeds 0-3 (mar_grpo): cosine 0.68-0.95, control -0.28..0.23; with 50 batches the control
    still reached 0.59 once, so fewer batches do not separate the two. CFG scale 1: with
    w = 3 the estimate is several times noisier (the null branch enters with weight 1 - w)."""
    params = tiny_params(**{
        "model.sampler": "flow", "model.flow_shift": 3.0, "sampling.cfg_scale": 1.0, "train.cfg_null_grad": True,
        "sampling.num_ar_steps": 2, "train.loss_ar_steps": 2, "train.loss_head_steps": 4,
        "train.prompts_per_step": 8, "train.group_size": 16, "train.beta_kl": 0.0,
        "methods.mar_grpo.estimator": "single", "methods.mar_grpo.topk": False,
        "methods.mar_grpo.consistency": False, "methods.mar_grpo.token_scope": "committed"})
    torch.manual_seed(0)
    policy = new_model(params)
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
    estimate = torch.zeros_like(exact)
    for _ in range(150):
        batch = tr.collect()
        adv = batch.adv[torch.randperm(len(batch.adv), generator=gen)] if shuffle else batch.adv
        tr.compute_grads(batch.rollout, batch.plans, adv)
        estimate -= flat()  # the loss gradient points downhill
    cos = torch.nn.functional.cosine_similarity(estimate, exact, dim=0).item()
    if shuffle:
        assert abs(cos) < 0.45, cos
    else:
        assert cos > 0.5, cos

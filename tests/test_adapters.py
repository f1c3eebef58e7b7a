"""NOVA and Harmon adapters: the trainer contracts TinyMAR meets, the published layouts
(manifests from the official code, probes/official_parity.py), loading errors, LoRA."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from margrpo.training.loop import train_step
from margrpo.models.adapters_common import parameter_manifest
from margrpo.models.chains import recompute_log_probs
from margrpo.models.loading import load_model
from margrpo.models.nova import NOVATransformer, nova_schedule
from margrpo.models.protocol import MARPolicy
from margrpo.models.published import WeightsError
from margrpo.method.plan import plan_tokens, speculative_steps_needed
from margrpo.training.trainer import Batch, Trainer
from margrpo.world.prompts import make_prompt_set

from adapter_fixtures import TINY_NOVA, Brightness, save_published_harmon, save_published_nova, tiny_harmon, tiny_nova
from conftest import tiny_params

DATA = Path(__file__).parent / "data"
PROMPTS = ["a red circle", "two blue squares", "a star left of a triangle", "one green square"]
TRAIN_PROMPTS = make_prompt_set("train", 2, seed=0)
FACTORIES = {"nova": tiny_nova, "harmon": tiny_harmon}
KINDS = sorted(FACTORIES)


def tiny_policy(kind: str, params=None):
    s = (params or tiny_params()).sampling
    return FACTORIES[kind](num_ar_steps=s.num_ar_steps, head_steps=s.head_steps, cfg_scale=s.cfg_scale)


def make_trainer(kind: str, method: str = "mar_grpo", **over) -> Trainer:
    """The one place these tests meet the trainer API (Trainer(policy, params, ...))."""
    params = tiny_params(**over)
    return Trainer.from_params(params, method, 0, TRAIN_PROMPTS, policy=tiny_policy(kind, params), reward=Brightness())


@pytest.mark.parametrize("kind", KINDS)
def test_recompute_equals_rollout_bitwise(kind):
    policy = tiny_policy(kind)
    assert isinstance(policy, MARPolicy)
    ro = policy.rollout(PROMPTS, generator=torch.Generator().manual_seed(3), speculative_steps=[1])
    assert ro.images.shape == (4, 3, 64, 64) and len(ro.steps) == policy.num_ar_steps
    assert sum(s.commit_idx.shape[1] for s in ro.steps) == policy.num_tokens
    with torch.no_grad():
        for i, step in enumerate(ro.steps):
            assert torch.equal(recompute_log_probs(policy, ro, [i])[0], step.logp)
        assert max(s.logp.abs().max().item() for s in ro.steps) > 1.0  # non-trivial log-probs
        for p in policy.ar_parameters():  # control: other parameters, other log-probs
            p.add_(0.05 * torch.randn_like(p))
        moved = recompute_log_probs(policy, ro, [2])[0]
    assert (moved - ro.steps[2].logp).abs().max().item() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_replay_from_recorded_seeds(kind):
    policy = tiny_policy(kind)
    a = policy.rollout(PROMPTS, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.images, policy.rollout(PROMPTS, seeds=a.seeds).images)
    alone = policy.rollout(PROMPTS[1:2], seeds=a.seeds[1:2], speculative_steps=[0, 2])
    # Same draws; only float rounding of another batch shape differs (random Harmon heads
    # give tokens of magnitude 1e4, hence the relative tolerance).
    torch.testing.assert_close(alone.tokens[0], a.tokens[1], rtol=1e-4, atol=1e-3)
    assert not torch.equal(a.images, policy.rollout(PROMPTS, generator=torch.Generator().manual_seed(8)).images)


@pytest.mark.parametrize("kind", KINDS)
def test_first_pass_ratio_is_one_and_frozen_head_gets_no_gradient(kind):
    tr = make_trainer(kind)
    metas, groups = tr.sample_batch()
    ar, heads, _ = tr.plan_steps()
    ro = tr.policy.rollout([m["prompt"] for m in metas], generator=torch.Generator().manual_seed(0),
                           speculative_steps=speculative_steps_needed(tr.method, ar))
    plans = plan_tokens(tr.scorer(ro), ro, ar, heads, tr.method)
    adv = torch.randn(len(metas))
    stats = tr.compute_grads(Batch(groups, ro, adv, adv, plans, 0.0))
    assert stats["diag/approx_kl"] == 0.0 and stats["diag/clipfrac"] == 0.0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in tr.ar_params)
    assert all(p.grad is None for p in tr.head_params)
    assert all(p.grad is None for p in tr.policy.text_parameters())  # frozen text encoder


@pytest.mark.parametrize("kind", KINDS)
def test_kl_zero_at_reference_then_two_steps(kind):
    tr = make_trainer(kind, **{"train.beta_kl": 1.0})
    first = train_step(tr)[0]
    assert first["loss/kl"] == 0.0
    second = train_step(tr)[0]
    assert second["loss/kl"] > 0.0 and torch.isfinite(torch.tensor(second["loss/policy"]))


def test_schedules_commit_every_token_once():
    # NOVA's rounded cosine commits 0 tokens at one of 64 steps for 1024 tokens: 63 AR steps
    # run, as in the official pipeline (it drops that step too).
    assert sum(nova_schedule(1024, 64)) == 1024 and len(nova_schedule(1024, 64)) == 63
    assert sum(nova_schedule(16, 8)) == 16  # tiny grids: steps that commit nothing are dropped
    order = torch.cat([s.commit_idx for s in tiny_policy("nova").rollout(PROMPTS[:1]).steps], 1)
    assert torch.equal(order.sort(1).values[0], torch.arange(16))


# ---- published layouts --------------------------------------------------------------
NOVA_SD512 = dict(image_dim=4, image_size=[512, 512], image_stride=8, text_token_dim=2560, text_token_len=256,
                  image_base_size=[32, 32], video_base_size=[1, 16, 16],
                  arch=["vit_d16w1024", "vit_d32w1024", "mlp_d3w1280"])


def test_nova_full_size_matches_the_official_manifest():
    ref = json.loads((DATA / "nova_manifest.json").read_text())
    with torch.device("meta"):
        ours = parameter_manifest(NOVATransformer(**ref["config"]))
    assert ours == ref["tensors"]
    assert sum(torch.Size(s).numel() for s in ours.values()) > 5e8  # the 0.6B transformer


def test_harmon_full_size_matches_the_official_manifest():
    from margrpo.models.harmon import build_harmon

    ref = json.loads((DATA / "harmon_manifest.json").read_text())
    with torch.device("meta"):
        ours = parameter_manifest(build_harmon(ref["config"], None))
    assert ours == ref["tensors"]
    assert sum(torch.Size(s).numel() for s in ours.values()) > 1.5e9


def adapter_params(kind: str, weights: Path, **over):
    return tiny_params(**{"model.kind": kind, "model.weights": str(weights), **over})


@pytest.mark.parametrize("kind", KINDS)
def test_published_folder_loads_and_replays(tmp_path, kind):
    policy = tiny_policy(kind)
    save = save_published_nova if kind == "nova" else save_published_harmon
    save(policy, tmp_path / "w")
    extra = {"model.image_size": 64, "model.llm_dtype": "float32"} if kind == "harmon" else {"model.llm_dtype": "float32"}
    loaded = load_model(tmp_path / "none", adapter_params(kind, tmp_path / "w", **extra))
    seeds = torch.tensor([5, 6])
    images = policy.rollout(PROMPTS[:2], seeds=seeds).images
    assert torch.equal(images, loaded.rollout(PROMPTS[:2], seeds=seeds).images)
    assert loaded.gradient_checkpointing  # the default at the published sizes (docs/models.md)
    if kind == "nova":  # by default the frozen Phi text encoder is stored in bfloat16: same images up to rounding
        half = load_model(tmp_path / "none", adapter_params(kind, tmp_path / "w"))
        assert {p.dtype for p in half.text_encoder.parameters()} == {torch.bfloat16}
        assert {p.dtype for p in half.transformer.parameters()} == {torch.float32}
        torch.testing.assert_close(half.rollout(PROMPTS[:2], seeds=seeds).images, images, atol=0.05, rtol=0)
    # A fine-tuned state saved on top of the published weights comes back.
    with torch.no_grad():
        next(loaded.ar_parameters()).add_(1.0)
    loaded.save_pretrained(tmp_path / "final", weights=str(tmp_path / "w"))
    again = load_model(tmp_path / "final", adapter_params(kind, tmp_path / "w", **extra))
    assert torch.equal(next(again.ar_parameters()), next(loaded.ar_parameters()))


def test_missing_or_mismatched_weights_fail_at_once(tmp_path):
    with pytest.raises(WeightsError, match="is not a folder"):
        load_model("unused", adapter_params("nova", tmp_path / "absent"))
    (tmp_path / "partial" / "transformer").mkdir(parents=True)
    with pytest.raises(WeightsError, match="missing model_index.json, transformer/config.json"):
        load_model("unused", adapter_params("nova", tmp_path / "partial"))
    with pytest.raises(WeightsError, match="missing config.json, model.safetensors"):
        load_model("unused", adapter_params("harmon", tmp_path / "partial"))
    policy = tiny_policy("nova")
    save_published_nova(policy, tmp_path / "w")
    wrong = dict(TINY_NOVA, arch=["vit_d2w32h2", "vit_d2w32h2", "mlp_d3w32"])  # one more head block
    (tmp_path / "w" / "transformer" / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(WeightsError, match=r"(?s)diffusion_pytorch_model.safetensors does not match .* missing \d+ tensors"):
        load_model("unused", adapter_params("nova", tmp_path / "w"))


# ---- parameter groups, LoRA, memory knobs -------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_parameter_groups_are_disjoint_and_text_is_frozen(kind):
    policy = tiny_policy(kind)
    ar, head, text = ({id(p) for p in g()} for g in (policy.ar_parameters, policy.head_parameters, policy.text_parameters))
    assert ar and head and text and not (ar & head) and not (ar & text) and not (head & text)
    assert not any(p.requires_grad for p in policy.text_parameters())
    policy.set_text_trainable(True)
    assert text <= {id(p) for p in policy.ar_parameters()}


def test_harmon_lora_keeps_the_frozen_llm_in_bfloat16_and_trains_float32_factors(tmp_path):
    pytest.importorskip("peft")
    save_published_harmon(tiny_policy("harmon"), tmp_path / "w")
    params = adapter_params("harmon", tmp_path / "w", **{"model.image_size": 64, "model.lora_rank": 2,
                                                         "methods.mar_grpo.estimator": "single"})
    policy = load_model(tmp_path / "none", params)
    assert {p.dtype for n, p in policy.llm.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for p in policy.ar_parameters()} == {torch.float32}
    tr = Trainer.from_params(params, "mar_grpo", 0, TRAIN_PROMPTS, policy=policy, reward=Brightness())
    before = [p.detach().clone() for p in tr.ar_params]
    metrics = train_step(tr)[0]
    assert math.isfinite(metrics["loss/policy"]) and metrics["diag/grad_norm_ar"] > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, tr.ar_params))


@pytest.mark.parametrize("kind", KINDS)
def test_lora_trains_only_the_low_rank_factors(kind):
    pytest.importorskip("peft")
    params = tiny_params(**{"methods.mar_grpo.estimator": "single"})
    policy = tiny_policy(kind, params)
    policy.apply_options(lora_rank=2)
    names = {id(p): n for n, p in policy.named_parameters()}
    lora = [p for p in policy.ar_parameters()]
    assert lora and all("lora_" in names[id(p)] for p in lora)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    tr = Trainer.from_params(params, "mar_grpo", 0, TRAIN_PROMPTS, policy=policy, reward=Brightness())
    train_step(tr)[0]
    train_step(tr)[0]
    assert all(torch.equal(p, base[n]) for n, p in policy.named_parameters() if "lora_" not in n)
    assert any(p.abs().sum() > 0 for n, p in policy.named_parameters() if "lora_B" in n)  # B starts at 0


@pytest.mark.parametrize("kind", KINDS)
def test_gradient_checkpointing_gives_the_same_gradient(kind):
    policy = tiny_policy(kind)
    ro = policy.rollout(PROMPTS[:2], seeds=torch.tensor([1, 2]))
    grads = []
    for ckpt in (False, True):
        policy.apply_options(gradient_checkpointing=ckpt)
        policy.zero_grad(set_to_none=True)
        recompute_log_probs(policy, ro, [2]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.ar_parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


"""runtime.device / runtime.dtype / runtime.nproc: validation, placement, bfloat16 forward
passes with float32 log-probs, and (where CUDA is present) the same draws and close numbers
on the GPU as on the CPU."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from margrpo.config import ParamsError, RuntimeConfig, load_params
from margrpo.models.chains import recompute_log_probs
from margrpo.models.device import place, resolve_device
from margrpo.models.loading import load_model

from conftest import tiny_params

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["a red circle", "two squares", "a blue triangle left of a circle", "a striped square"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_params_yaml_runtime_is_the_default():
    assert load_params(REPO / "params.yaml").runtime == RuntimeConfig()


@pytest.mark.parametrize("key,value", [("nproc", 0), ("device", "tpu"), ("dtype", "float16")])
def test_runtime_errors_name_the_key(key, value):
    with pytest.raises(ParamsError, match=f"runtime.{key}"):
        tiny_params(**{f"runtime.{key}": value})


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(RuntimeError, match="runtime.device is 'cuda' but PyTorch sees no CUDA device"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_load_model_applies_runtime(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path / "m")
    loaded = load_model(tmp_path / "m", tiny_params(**{"runtime.dtype": "bfloat16"}))
    assert loaded.device == torch.device("cpu") and loaded.compute_dtype == torch.bfloat16
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}  # autocast, not cast weights


def test_bfloat16_forward_passes_keep_float32_chains_and_log_probs(tiny_model):
    seeds = torch.tensor([3, 4, 5, 6])
    ref = tiny_model.rollout(PROMPTS, seeds=seeds)
    model = place(copy.deepcopy(tiny_model), "cpu", "bfloat16")
    ro = model.rollout(PROMPTS, seeds=seeds, speculative_steps=[1])
    assert all(s.chain.dtype == s.logp.dtype == s.mean.dtype == torch.float32 for s in ro.steps)
    assert not torch.equal(ro.images, ref.images)  # autocast did act ...
    assert (ro.images - ref.images).abs().mean() < 0.05  # ... and only by rounding
    with torch.no_grad():  # recompute == rollout holds in bfloat16 too (same ops, same shapes)
        diff = [(recompute_log_probs(model, ro, [i])[0] - ro.steps[i].logp).abs().max() for i in range(len(ro.steps))]
    assert max(diff) <= 1e-3
    ids = model.tokenize(PROMPTS)
    pre = tiny_params().pretrain
    loss = model.training_loss(ro.images, ids, torch.Generator().manual_seed(0), pre.prompt_dropout,
                               pre.diffusion_batch_mul)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())


def test_gpu_profile_sizes():
    """params_gpu.yaml validates on top of params.yaml and meets issue 15's sizes: >= 512
    images per step, >= 2500 GenEval-tag images per evaluation replicate (standard error
    <= 0.01 at accuracy 0.5), the GPU as device."""
    import yaml

    from margrpo.config import parse_params
    from margrpo.world.grammar import GENEVAL_TAGS
    from pipeline.profile import merge

    base = yaml.safe_load((REPO / "params.yaml").read_text())
    p = parse_params(merge(base, yaml.safe_load((REPO / "params_gpu.yaml").read_text())), "params_gpu.yaml")
    assert p.train.prompts_per_step * p.train.group_size >= 512
    tag_images = len(GENEVAL_TAGS) * p.world.heldout_prompts_per_tag * p.evaluate.images_per_prompt
    assert tag_images >= 2500 and 0.5 / math.sqrt(tag_images) <= 0.01
    assert p.runtime.device == "cuda"


# ---- on a GPU ---------------------------------------------------------------------------
@pytest.mark.cuda
@cuda
def test_cuda_rollout_draws_as_cpu_and_recomputes(tiny_model):
    gpu = place(copy.deepcopy(tiny_model), "cuda")
    seeds = torch.tensor([11, 12, 13, 14])
    a = tiny_model.rollout(PROMPTS, seeds=seeds, speculative_steps=[1])
    b = gpu.rollout(PROMPTS, seeds=seeds, speculative_steps=[1])
    assert b.images.device.type == "cuda"
    for sa, sb in zip(a.steps, b.steps):
        assert torch.equal(sa.commit_idx, sb.commit_idx.cpu()) and torch.equal(sa.chain[0], sb.chain[0].cpu())
    assert (a.images - b.images.cpu()).abs().max() < 1e-3  # float kernels round differently
    with torch.no_grad():
        diff = max((recompute_log_probs(gpu, b, [i])[0] - b.steps[i].logp).abs().max().item() for i in range(len(b.steps)))
    assert diff <= 1e-4


@pytest.mark.cuda
@cuda
def test_cuda_bfloat16_rollout_has_float32_log_probs(tiny_model):
    gpu = place(copy.deepcopy(tiny_model), "cuda", "bfloat16")
    ro = gpu.rollout(PROMPTS, seeds=torch.tensor([1, 2, 3, 4]))
    assert ro.steps[0].logp.dtype == torch.float32 and torch.isfinite(ro.steps[-1].logp).all()


@pytest.mark.cuda
@cuda
def test_cuda_pretraining_and_evaluation_sampling(tiny_model):
    from margrpo.world.generate import sample_images
    from margrpo.models.pretrain import PretrainSettings, pretrain

    s = PretrainSettings(steps=3, batch_size=8, warmup_steps=1, log_every=1)
    losses = {}
    for name, model in (("cpu", copy.deepcopy(tiny_model)), ("cuda", place(copy.deepcopy(tiny_model), "cuda"))):
        logged = []
        pretrain(model, s, on_log=lambda step, m: logged.append(m["pretrain/loss"]), progress=False)
        losses[name] = logged
    # The same batches, masks and noise on both devices: the first loss agrees to float
    # rounding (another batch would differ by far more), later ones after Adam steps closely.
    assert losses["cuda"][0] == pytest.approx(losses["cpu"][0], rel=1e-4)
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-2)
    gpu = place(copy.deepcopy(tiny_model), "cuda")
    seeds = torch.tensor([[1, 2], [3, 4]])
    images = sample_images(gpu, PROMPTS[:2], seeds, batch_size=3, progress=False)
    assert images.device.type == "cpu" and images.shape[:2] == (2, 2)
    torch.testing.assert_close(images, sample_images(tiny_model, PROMPTS[:2], seeds, 4, progress=False), atol=1e-3, rtol=0)

"""Device placement without a GPU: TinyMAR and the tiny NOVA / Harmon adapters loaded with
runtime.device cuda, rolled out and trained one step with every tensor on a stand-in GPU
(tests/fake_cuda.py), where any op that mixes a CPU tensor with a GPU one raises as it
would on CUDA. The stand-in computes on the CPU, so the step's numbers must equal a CPU
step's exactly."""
from __future__ import annotations

import math

import pytest
import torch

from margrpo.training.loop import train_step
from margrpo.models import device as device_module
from margrpo.models import loading
from margrpo.training.trainer import Trainer
from margrpo.world.prompts import make_prompt_set

import fake_cuda
from adapter_fixtures import Brightness, save_published_harmon, save_published_nova, tiny_harmon, tiny_nova
from conftest import tiny_params

PROMPTS = make_prompt_set("train", 2, seed=0)
ADAPTER = {"nova": (tiny_nova, save_published_nova, {}),
           "harmon": (tiny_harmon, save_published_harmon, {"model.image_size": 64})}


def fake_resolve(name: str) -> torch.device:
    """runtime.device -> the stand-in GPU for cuda / auto (what a GPU machine resolves)."""
    return fake_cuda.DEVICE if name in ("cuda", "auto") else torch.device(name)


def saved_policy(kind: str, tmp_path, tiny_model):
    """(model path, params) of a saved policy of `kind`, loaded the way the pipeline loads it."""
    if kind == "tiny":
        tiny_model.save_pretrained(tmp_path / "m")
        return tmp_path / "m", {}
    factory, save, extra = ADAPTER[kind]
    s = tiny_params().sampling
    save(factory(num_ar_steps=s.num_ar_steps, head_steps=s.head_steps, cfg_scale=s.cfg_scale), tmp_path / "w")
    return tmp_path / "none", {"model.kind": kind, "model.weights": str(tmp_path / "w"), **extra}


def one_step(path, over: dict, reward) -> tuple[dict, Trainer, object]:
    params = tiny_params(**over)
    policy = loading.load_model(path, params)
    tr = Trainer.from_params(params, "mar_grpo", 0, PROMPTS, policy=policy, reward=reward)
    metrics, batch = train_step(tr)
    return metrics, tr, batch


@pytest.mark.parametrize("kind", ["tiny", "nova", "harmon"])
def test_rollout_and_training_step_on_a_gpu_stand_in(kind, tmp_path, tiny_model, monkeypatch):
    from conftest import RedReward

    reward = RedReward() if kind == "tiny" else Brightness()
    path, over = saved_policy(kind, tmp_path, tiny_model)
    over = {**over, "train.beta_kl": 0.1}  # the KL reference copy is placed too
    cpu_metrics, _, _ = one_step(path, {**over, "runtime.device": "cpu"}, reward)

    for module in (device_module, loading):
        monkeypatch.setattr(module, "resolve_device", fake_resolve, raising=False)
    with fake_cuda.fake_cuda():
        metrics, tr, batch = one_step(path, {**over, "runtime.device": "cuda"}, reward)
        devices = {p.device for p in tr.policy.parameters()} | {b.device for b in tr.policy.buffers()}
        grads = [p.grad for p in tr.trained if p.grad is not None]
        ro = batch.rollout

    assert devices == {fake_cuda.DEVICE}, devices
    assert ro.tokens.device == fake_cuda.DEVICE and ro.steps[0].chain.device == fake_cuda.DEVICE
    assert grads and all(g.device == fake_cuda.DEVICE for g in grads)
    # The same draws and ops on the same CPU numbers: the step is the CPU step, metric for
    # metric, up to float rounding (gradient norms differ by about 1e-7 relative).
    timing = {k for k in cpu_metrics if k.startswith("time/")}
    assert set(metrics) == set(cpu_metrics)
    for k in sorted(set(metrics) - timing):
        a, b = metrics[k], cpu_metrics[k]
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6) or (math.isnan(a) and math.isnan(b)), (k, a, b)
    # CUDA accepts CPU index tensors (copying them to the device each time); the models use none.
    in_models = [m for m in fake_cuda.MIXES if "margrpo/models/" in m]
    assert not in_models, f"GPU tensors indexed with CPU index tensors: {in_models}"


@pytest.mark.parametrize("kind", sorted(ADAPTER))
def test_place_moves_an_adapter_built_in_code(kind, monkeypatch):
    """models/device.place on an adapter built without the loader (scripts, notebooks):
    runtime.device and runtime.dtype apply as they do to the TinyMAR."""
    from margrpo.models.device import place

    s = tiny_params().sampling
    policy = ADAPTER[kind][0](num_ar_steps=s.num_ar_steps, head_steps=s.head_steps, cfg_scale=s.cfg_scale)
    monkeypatch.setattr(device_module, "resolve_device", fake_resolve)
    with fake_cuda.fake_cuda():
        place(policy, "cuda", "float32")
        tr = Trainer.from_params(tiny_params(), "mar_grpo", 0, PROMPTS, policy=policy, reward=Brightness())
        metrics, batch = train_step(tr)
        assert policy.device == fake_cuda.DEVICE and batch.rollout.images.device == fake_cuda.DEVICE
    assert math.isfinite(metrics["loss/policy"]) and metrics["diag/grad_norm_ar"] > 0
    assert place(policy.cpu(), "cpu", "bfloat16").ar_dtype == torch.bfloat16  # runtime.dtype reaches the adapter


def test_the_stand_in_refuses_what_cuda_refuses():
    """Control: the harness does raise where CUDA would, and allows what CUDA allows."""
    with fake_cuda.fake_cuda() as dev:
        x = torch.ones(3, device=dev)
        with pytest.raises(fake_cuda.DeviceMixError, match="a CPU tensor meets a CUDA tensor"):
            x + torch.ones(3)
        with pytest.raises(fake_cuda.DeviceMixError, match="CPU torch.Generator"):
            torch.randn(3, device=dev, generator=torch.Generator().manual_seed(0))
        assert (x * torch.tensor(2.0)).device == dev  # a 0-dim CPU tensor is a scalar, as on CUDA
        assert x.cpu().device.type == "cpu" and torch.equal(x.cpu(), torch.ones(3))
        assert torch.zeros(2, device=x.device).device == dev

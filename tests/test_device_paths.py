"""What runs on the GPU, made runnable on the CPU for the GPU check's smoke run.

On a machine with CUDA (`pytest -m cuda`, as scripts/gpu_check.sh runs it) every test here
runs on the GPU; without one it is skipped, unless MARGRPO_CHECK_DEVICE=cpu (set by
`scripts/gpu_check.sh --cpu-smoke`) runs the same code on the CPU, so that the check's
bare-machine path is exercised where there is no GPU:
- one torchrun rank on the device: the NCCL process group (gloo on the CPU) and its
  collectives, then a short training run that ends where the same run in a plain process does;
- a NOVA and a Harmon training step on the device: the batch stays there, losses are finite,
  the trained weights move.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from margrpo.training.loop import train_step
from margrpo.models.loading import new_model
from margrpo.ranks.launch import torchrun_command
from margrpo.training.trainer import Trainer
from margrpo.study import train_run
from margrpo.world.grammar import VOCAB
from margrpo.world.prompts import make_prompt_set

from adapter_fixtures import Brightness, tiny_harmon, tiny_nova
from conftest import randomize_head, tiny_params
from one_rank_worker import run_params

TESTS = Path(__file__).resolve().parent
DEVICE = os.environ.get("MARGRPO_CHECK_DEVICE", "cuda")
if DEVICE not in ("cuda", "cpu"):
    raise ValueError(f"MARGRPO_CHECK_DEVICE must be cuda or cpu, got {DEVICE!r}")
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                                   reason="needs a CUDA device (or MARGRPO_CHECK_DEVICE=cpu)")]
WEIGHTS = "diffusion_pytorch_model.safetensors"


def _max_diff(a: Path, b: Path) -> float:
    wa, wb = load_file(a / WEIGHTS), load_file(b / WEIGHTS)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def test_one_torchrun_rank_on_the_device_trains_like_a_plain_process(tmp_path):
    torch.manual_seed(0)
    randomize_head(new_model(run_params(DEVICE), VOCAB), seed=1).save_pretrained(tmp_path / "base")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    out = subprocess.run(torchrun_command(1, "one_rank_worker", [str(tmp_path), DEVICE]), cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((tmp_path / "collectives.json").read_text()) == {
        "backend": "nccl" if DEVICE == "cuda" else "gloo", "rank": 0, "size": 1, "device": DEVICE,
        "all_reduce": [2.0, 2.0, 2.0], "gathered": [{"rank": 0}]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the rank, so that the CPU's sums round alike
    try:
        train_run(run_params(DEVICE), "mar_grpo", 0, tmp_path / "plain", progress=False,
                  train_prompts=make_prompt_set("train", 2, seed=0), checkpoint=str(tmp_path / "base"))
    finally:
        torch.set_num_threads(threads)
    diff = _max_diff(tmp_path / "rank" / "final", tmp_path / "plain" / "final")
    # CUDA's atomic adds make a gradient's last bits vary; AdamW turns them into at most ~lr * 1e-3
    assert diff <= (1e-6 if DEVICE == "cuda" else 0.0), diff
    assert _max_diff(tmp_path / "base", tmp_path / "plain" / "final") > 1e-5  # training moved the weights


@pytest.mark.parametrize("factory", [tiny_nova, tiny_harmon], ids=["nova", "harmon"])
def test_an_adapter_step_keeps_its_batch_on_the_device(factory):
    params = tiny_params(**{"runtime.device": DEVICE})
    s = params.sampling
    policy = factory(num_ar_steps=s.num_ar_steps, head_steps=s.head_steps, cfg_scale=s.cfg_scale).to(DEVICE)
    tr = Trainer.from_params(params, "mar_grpo", 0, make_prompt_set("train", 2, seed=0), policy=policy,
                             reward=Brightness())
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if n in tr.trained_names}
    metrics, batch = train_step(tr)
    assert {batch.rewards.device.type, batch.adv.device.type, batch.groups.device.type} == {DEVICE}
    assert all(p.draw.states.device.type == DEVICE and p.mask.device.type == DEVICE for p in batch.plans)
    assert all(math.isfinite(metrics[k]) for k in ("loss/policy", "diag/grad_norm_ar")), metrics
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in policy.named_parameters() if n in before)
    assert moved > 0

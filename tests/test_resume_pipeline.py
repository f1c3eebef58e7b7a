"""Killing `dvc repro` during training and rerunning it resumes from the last checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from pipeline_tiny import TINY, VENV_BIN, merge, pipeline_env, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# One seed, many cheap steps, a checkpoint every 5: the kill lands mid-training.
LONG = merge(TINY, {"train": {"seeds": [0], "steps": 400, "checkpoint_every": 5, "grad_probe_every": 0}})


def test_killed_repro_resumes(tmp_path):
    root = scratch_repo(tmp_path / "repo", LONG)
    env = pipeline_env(root)
    dvc = [str(VENV_BIN / "dvc"), "repro", "train@grpo"]
    # A new session, so the SIGTERM reaches dvc and the stage process it started.
    proc = subprocess.Popen(dvc, cwd=root, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    ckpts = []
    while time.time() < deadline and not ckpts and proc.poll() is None:
        time.sleep(0.1)
        ckpts = list((root / "outputs/ckpt/grpo").glob("*/seed0/ckpt.pt"))
    assert ckpts, "no checkpoint appeared:\n" + (proc.communicate()[0] if proc.poll() is not None else "")
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    first = proc.communicate(timeout=60)[0]
    history = ckpts[0].parent / "history.jsonl"
    done_before = len(history.read_text().splitlines())
    assert 0 < done_before < LONG["train"]["steps"], f"not killed mid-training ({done_before} steps):\n{first[-2000:]}"

    rerun = subprocess.run(dvc, cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    out = rerun.stdout + rerun.stderr
    assert "resuming from the checkpoint" in out, out[-3000:]
    steps = [json.loads(line)["step"] for line in history.read_text().splitlines()]
    assert steps == list(range(1, LONG["train"]["steps"] + 1)), "history must cover every step exactly once"
    assert (root / "models/rl/grpo/seed0/final/config.json").exists()
    status = subprocess.run([str(VENV_BIN / "dvc"), "status", "train@grpo"], cwd=root, env=env,
                            capture_output=True, text=True)
    assert "up to date" in status.stdout or status.stdout.strip() == "", status.stdout

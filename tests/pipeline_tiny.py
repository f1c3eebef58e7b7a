"""Shared by the pipeline tests: a tiny params profile and a scratch copy of the repo."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent

# Small enough that every stage takes seconds on a shared 2-core machine; two seeds so the
# spread-over-seeds code paths run.
TINY = {
    "num_trajectories": 2,
    # 32 px images (the world reward's default size) cut into 4 tokens of 16x16 px.
    "world": {"train_prompts_per_tag": 2, "heldout_prompts_per_tag": 1},
    "model": {"patch_size": 16, "width": 32, "depth": 1, "heads": 2, "cond_dim": 16, "head_width": 32, "head_depth": 1},
    "pretrain": {"steps": 3, "batch_size": 8, "warmup_steps": 1, "decay_steps": 1, "log_every": 1, "compile": False},
    "sampling": {"num_ar_steps": 2, "head_steps": 3},
    "train": {"seeds": [0, 1], "steps": 3, "prompts_per_step": 2, "group_size": 2, "loss_ar_steps": 1,
              "loss_head_steps": 2, "loss_head_window": 3, "checkpoint_every": 1, "grad_probe_every": 2},
    "evaluate": {"images_per_prompt": 2, "batch_size": 32, "grid_prompts": 3},
}


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def scratch_repo(dst: Path, overrides: dict) -> Path:
    """Copy the working tree's tracked and untracked-not-ignored files (no venv, no outputs)
    to dst, apply the overrides to params.yaml and commit it, as DVC experiments need."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    params = yaml.safe_load((dst / "params.yaml").read_text())
    (dst / "params.yaml").write_text(yaml.safe_dump(merge(params, overrides), sort_keys=False))
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    subprocess.run(git + ["add", "-A"], cwd=dst, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "scratch copy"], cwd=dst, check=True)
    return dst


def pipeline_env(root: Path) -> dict[str, str]:
    """Environment of a stage run: the venv first on PATH (dvc runs `python -m ...`), the
    default tracking store in the scratch repo, a private Prefect home, one torch thread,
    and the scratch copy's sources first on sys.path (margrpo is installed editable from
    the main tree)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PREFECT_HOME": str(root / ".prefect-home"),
        "PYTHONPATH": str(root / "src"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DVC_NO_ANALYTICS": "1",
    })
    return env

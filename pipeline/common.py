"""Shared by the stage entry points: paths, params, and the writers that replace committed
outputs only when they are complete. The process itself (signals, lock, reaper, ranks, exit
status) and the MLflow study whose runs end with it are pipeline/proc.py's.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path

# Committed outputs are `persist: true` in dvc.yaml (DVC does not delete them before the
# stage runs) and change only when these swap a complete new version into place.
from margrpo.atomic import replace_dir, write_text, write_with  # noqa: F401  (stage modules call common.*)

PARAMS_FILE = Path("params.yaml")

# Paths are relative to the stage's working directory (the repo root, or the scratch copy
# of `dvc exp run --temp`); dvc.yaml declares the same paths.
PROMPTS = Path("prompts")
TRAIN_PROMPTS = PROMPTS / "world_train.jsonl"
HELDOUT_PROMPTS = PROMPTS / "world_heldout.jsonl"
TEST_PROMPTS = PROMPTS / "world_test.jsonl"
RL_MODELS = Path("models/rl")
REPORTS = Path("reports")

EVAL_TARGETS = ("base",)  # besides every trained method


def tracking_root() -> Path:
    """Where mlflow.db lives: the main repo even for queued / temp experiments."""
    from margrpo.tracking.runs import main_repo_root

    return main_repo_root(Path(os.environ.get("DVC_ROOT") or Path.cwd()))


@functools.lru_cache(maxsize=1)
def load():
    """Validate params.yaml before any work (once per process); every flow starts here."""
    from margrpo.config import load_params

    return load_params(PARAMS_FILE)


def exp_name() -> str:
    return os.environ.get("DVC_EXP_NAME") or "workspace"


def trained_model_dir(method: str, seed: int) -> Path:
    return RL_MODELS / method / f"seed{seed}"


def model_for(target: str, seed: int, params, which: str = "final") -> Path:
    """The model an evaluation target uses for replicate `seed` (base: the same model);
    which: final (after the last step) or best (best held-out score during training)."""
    return Path(params.model.checkpoint) if target == "base" else trained_model_dir(target, seed) / which


def write_json(obj, path: Path) -> None:
    write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def save_png(image, path: Path) -> None:
    """A PIL image, whole or not at all."""
    write_with(path, lambda tmp: image.save(tmp, format="PNG"))


def staging_dir(dest: Path) -> Path:
    """An empty sibling folder of `dest` to write a new version of it into."""
    dest = Path(dest)
    staged = dest.with_name(f".{dest.name}.new{os.getpid()}")
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    return staged

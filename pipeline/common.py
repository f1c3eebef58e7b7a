"""Shared by every stage entry point: process preamble, paths, params, MLflow study.

Call `preamble()` first thing in each entry point, before Prefect is imported: it installs
the SIGTERM handler (a flow killed by SIGTERM otherwise orphans the temporary Prefect API
server it started) and the quiet / offline environment defaults.
"""
from __future__ import annotations

import faulthandler
import hashlib
import json
import logging
import os
import signal
import sys
from pathlib import Path

# setdefault: a user's own settings (e.g. PREFECT_API_URL, PREFECT_LOGGING_LEVEL) win.
QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_TO_API_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

PARAMS_FILE = Path("params.yaml")

# Paths are relative to the stage's working directory (the repo root, or the scratch copy
# of `dvc exp run --temp`); dvc.yaml declares the same paths.
PROMPTS = Path("prompts")
TRAIN_PROMPTS = PROMPTS / "world_train.jsonl"
HELDOUT_PROMPTS = PROMPTS / "world_heldout.jsonl"
RL_MODELS = Path("models/rl")
REPORTS = Path("reports")
# Training checkpoints live outside every DVC output (DVC deletes outputs before a stage
# reruns), in a folder keyed by everything that determines training, so a rerun after a
# kill resumes and a rerun with other params starts fresh.
CHECKPOINTS = Path("outputs/ckpt")

EVAL_TARGETS = ("base",)  # besides every trained method


# Seconds a terminated stage gets to report the crash to Prefect and stop its server.
TERM_GRACE_S = 10


def _hard_exit(*_) -> None:
    import psutil  # a DVC dependency

    for child in psutil.Process().children(recursive=True):
        child.terminate()
    os._exit(143)


def _on_sigterm(*_) -> None:
    # Unwinding (SystemExit) lets Prefect mark the run crashed and stop the temporary API
    # server it started. When the whole process group was signalled (Ctrl-C / kill of a
    # `dvc repro` session), that server is already gone and Prefect would retry its state
    # report for minutes: after the grace period, stop the children and leave at once.
    signal.signal(signal.SIGTERM, _hard_exit)
    signal.signal(signal.SIGALRM, _hard_exit)
    signal.alarm(TERM_GRACE_S)
    sys.exit(143)


def preamble() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a stage hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # MLflow announces database creation and migrations at INFO on every new store.
    logging.getLogger("mlflow").setLevel(logging.WARNING)


def tracking_root() -> Path:
    """Where mlflow.db lives: the main repo even for queued / temp experiments."""
    from margrpo.tracking.runs import main_repo_root

    return main_repo_root(Path(os.environ.get("DVC_ROOT") or Path.cwd()))


def load():
    """Validate params.yaml before any work; every flow starts here."""
    from margrpo.config import load_params

    return load_params(PARAMS_FILE)


def open_study(params):
    from margrpo.tracking.runs import Study, artifact_root, git_revision, study_id, tracking_uri

    root = tracking_root()
    rev = git_revision(root)
    tags = {
        "git.revision": rev,
        "mlflow.source.git.commit": rev,
        "dvc.exp_name": os.environ.get("DVC_EXP_NAME", "workspace"),
    }
    sid = study_id(root, PARAMS_FILE.read_text())
    return Study(tracking_uri(root), sid, params.model_dump(mode="json"), tags, artifact_root(root))


def trained_model_dir(method: str, seed: int) -> Path:
    return RL_MODELS / method / f"seed{seed}"


def train_record_dir(method: str, seed: int) -> Path:
    """Per-seed history and selection maps (a `cache: false` output, in git)."""
    from margrpo.report.build import train_record_dir

    return train_record_dir(REPORTS, method, seed)


def model_for(target: str, seed: int, params) -> Path:
    """The model a evaluation target uses for replicate `seed` (base: the same model)."""
    return Path(params.model.checkpoint) if target == "base" else trained_model_dir(target, seed) / "final"


def file_digest(path: Path) -> str:
    """sha256 of a file, or of every file under a folder (names and contents)."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    for f in files:
        h.update(str(f.relative_to(path) if Path(path).is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def checkpoint_dir(params, method: str, seed: int) -> Path:
    """outputs/ckpt/<method>/<key>/seed<seed>: key hashes what determines the training run
    (train.seeds excluded: adding a seed must not discard the others' checkpoints)."""
    spec = {
        "method": params.method(method).model_dump(mode="json"),
        "train": params.train.model_dump(mode="json", exclude={"seeds"}),
        "sampling": params.sampling.model_dump(mode="json"),
        "rewards": [r.model_dump(mode="json") for r in params.rewards],
        "model": params.model.model_dump(mode="json", exclude={"checkpoint"}),
        "image_size": params.world.image_size,
        "base": file_digest(Path(params.model.checkpoint)),
        "prompts": file_digest(TRAIN_PROMPTS),
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return CHECKPOINTS / method / key / f"seed{seed}"


def write_json(obj, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")

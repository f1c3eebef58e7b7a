"""Shared by every stage entry point: process preamble, paths, params, MLflow study, and
the writers that replace committed outputs only when they are complete.

Call `preamble()` first thing in each entry point, before Prefect is imported: it sets up
the process (pipeline/proc.py: SIGTERM handler, DVC repo lock, reaper) and the quiet /
offline environment defaults. End the entry point with `run(stage, flow, *args)`: it
validates params.yaml before Prefect starts and ends the stage's MLflow runs as FINISHED,
FAILED or KILLED.
"""
from __future__ import annotations

import faulthandler
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

# setdefault: a user's own settings (e.g. PREFECT_API_URL, PREFECT_LOGGING_LEVEL) win.
QUIET_ENV = {
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_LOGGING_LEVEL": "WARNING",
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
TEST_PROMPTS = PROMPTS / "world_test.jsonl"
RL_MODELS = Path("models/rl")
REPORTS = Path("reports")
# Training checkpoints live outside every DVC output (DVC deletes outputs before a stage
# reruns), in a folder keyed by everything that determines training, so a rerun after a
# kill resumes and a rerun with other params starts fresh.
CHECKPOINTS = Path("outputs/ckpt")

EVAL_TARGETS = ("base",)  # besides every trained method


_STUDY = None  # the Study this process opened (common.open_study), closed by `run`


def preamble() -> None:
    from pipeline import proc

    proc.start()
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a stage hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # MLflow announces database creation and migrations at INFO on every new store.
    logging.getLogger("mlflow").setLevel(logging.WARNING)


class _OneLineTaskErrors(logging.Filter):
    """Prefect logs an exception's traceback for the failed task and again for its flow; the
    task's record keeps its message (and retry notes) without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def run(stage: str, flow, *args) -> None:
    """Validate params.yaml, then run the stage's flow; end the stage's MLflow runs as
    FINISHED, FAILED or KILLED, and report a failure in one line (Prefect has already
    logged the traceback of an exception raised inside the flow, once)."""
    from margrpo.config import ParamsError

    logging.getLogger("prefect.task_runs").addFilter(_OneLineTaskErrors())
    try:
        load()
    except ParamsError as err:
        sys.stderr.write(f"{stage}: {err}\n")
        sys.exit(2)
    try:
        flow(*args)
    except (SystemExit, KeyboardInterrupt) as err:
        _end_study("KILLED")
        raise SystemExit(130 if isinstance(err, KeyboardInterrupt) else err.code) from None
    except ParamsError as err:
        _end_study("FAILED")
        sys.stderr.write(f"{stage}: {err}\n")
        sys.exit(2)
    except Exception as err:  # noqa: BLE001 - reported in one line, traceback already shown
        if _unwinding(err):  # an error raised while a signal unwound the flow
            _end_study("KILLED")
            sys.stderr.write(f"{stage}: killed (SIGTERM; while stopping: {type(err).__name__}: {err})\n")
            sys.exit(143)
        _end_study("FAILED")
        sys.stderr.write(f"{stage}: failed: {type(err).__name__}: {err}\n")
        sys.exit(1)
    _end_study("FINISHED")


def _key(option: str, help: str, doc: str) -> str:
    """The value of --<option> on the command line (doc's first line describes the command)."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(f"--{option}", required=True, help=help)
    return getattr(parser.parse_args(), option)


def run_keyed(stage: str, option: str, help: str, launch, doc: str) -> None:
    """The entry point of a foreach stage, `python -m pipeline.<stage> --<option> KEY`:
    run(f"{stage}@{KEY}", launch, KEY). doc: the module docstring (its first line is the
    command's description)."""
    key = _key(option, help, doc)
    run(f"{stage}@{key}", launch, key)


def start_ranks_early(stage: str, option: str, help: str, doc: str, module: str, check=None) -> None:
    """Called by a data-parallel stage (train, evaluate) before it imports Prefect and torch.
    In the stage's own process with runtime.nproc > 1: validate params.yaml, run check(params, key),
    start the ranks of `python -m module` under torchrun and exit with their status, all
    inside run() (errors in one line, the same exit codes). The ranks import what they need;
    this process imports neither (4.1 s and 2.3 s of imports, timed on busy cores). Returns at once in a rank,
    with one process, and when params.yaml does not validate (the stage's main() reports it)."""
    from margrpo.config import ParamsError
    from margrpo.rl.launch import start_ranks, under_torchrun

    if under_torchrun():
        return
    key = _key(option, help, doc)
    try:
        params = load()
    except ParamsError:
        return
    if params.runtime.nproc <= 1:
        return

    def launch(_key: str) -> None:
        if check is not None:
            check(params, _key)
        sys.exit(start_ranks(params.runtime.nproc, module, sys.argv[1:]))

    run(f"{stage}@{key}", launch, key)


def _unwinding(err: BaseException) -> bool:
    """Whether err arose while a signal unwound the stage: its chain holds a SystemExit,
    KeyboardInterrupt or Prefect's TerminationSignal (Prefect swaps in its own SIGTERM
    handler during a flow, then reports the crash; with its server gone, as when torchrun
    signals a rank's whole process group, that report raises ConnectError)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        if not isinstance(cur, Exception):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _end_study(status: str) -> None:
    if _STUDY is not None:
        _STUDY.abort(status)


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


def open_study(params):
    """The study's MLflow parent run (RUNNING while this stage runs); `run` ends it."""
    global _STUDY
    from margrpo.tracking.runs import (Study, artifact_root, git_revision, params_hash, study_id, study_name,
                                       tracking_uri)

    from pipeline import proc

    root = tracking_root()
    rev = git_revision(root)
    text = PARAMS_FILE.read_text()
    tags = {
        "git.revision": rev,
        "mlflow.source.git.commit": rev,
        "dvc.exp_name": exp_name(),
        "params.hash": params_hash(text),
    }
    uri = tracking_uri(root)
    proc.tell_reaper(uri=uri)
    _STUDY = Study(uri, study_id(root, text), params.model_dump(mode="json"), tags, artifact_root(root),
                   name=study_name(exp_name(), rev), watcher=lambda what, run_id: proc.tell_reaper(**{what: run_id}))
    return _STUDY


def trained_model_dir(method: str, seed: int) -> Path:
    return RL_MODELS / method / f"seed{seed}"


def model_for(target: str, seed: int, params, which: str = "final") -> Path:
    """The model an evaluation target uses for replicate `seed` (base: the same model);
    which: final (after the last step) or best (best held-out score during training)."""
    return Path(params.model.checkpoint) if target == "base" else trained_model_dir(target, seed) / which


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
    from margrpo.config import IN_TRAIN

    resolved = params.method(method)
    # The method's step count, batch, LR schedule and probe interval are in "train"
    # (train_for); paired_base only adds a measurement, so runs without it keep the keys they
    # had before it existed.
    unkeyed = set(IN_TRAIN) | (set() if resolved.paired_base else {"paired_base"})
    spec = {
        "method": resolved.model_dump(mode="json", exclude=unkeyed),
        "train": params.train_for(method).model_dump(mode="json", exclude={"seeds"}),
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
    write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", path)


def write_text(text: str, path: Path) -> None:
    """Write through a temporary file and rename: a kill leaves the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_png(image, path: Path) -> None:
    """A PIL image written like write_text: whole or not at all."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


def replace_dir(staged: Path, dest: Path) -> None:
    """Swap a fully written folder into place. Outputs committed to git are `persist: true`
    in dvc.yaml (DVC does not delete them before the stage runs), so a stage killed midway
    leaves the committed files as they were; this swap is the only moment they change."""
    dest = Path(dest)
    old = dest.with_name(f".{dest.name}.old{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(staged, dest)
    if old.exists():
        shutil.rmtree(old)


def staging_dir(dest: Path) -> Path:
    """An empty sibling folder of `dest` to write a new version of it into."""
    dest = Path(dest)
    staged = dest.with_name(f".{dest.name}.new{os.getpid()}")
    if staged.exists():
        shutil.rmtree(staged)
    staged.mkdir(parents=True)
    return staged

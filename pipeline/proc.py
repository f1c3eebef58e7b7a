"""The stage process in one place: how every `python -m pipeline.<stage>` starts, runs and ends.

A stage module defines its flow with `flow` and `task` (below) and ends with

    if __name__ == "__main__":
        proc.main("report", report)                                        # one process
        proc.main("train", train_method, key=("method", HELP), doc=__doc__, ranks=True)  # data parallel

Importing a stage module runs nothing: no handler, no lock, no Prefect, no torch. `main` is
the process's whole life:
1. setup: SIGTERM unwinds, SIGUSR1 prints every thread's stack, quiet and offline defaults
   for Prefect / MLflow / DVC, DVC's repo lock and the reaper (below);
2. params.yaml is validated before Prefect starts (a refusal: one line, exit 2);
3. ranks=True in the stage's own process, with more than one rank over all nodes: start this
   node's ranks of the same command under torchrun (margrpo.ranks.launch, the one launch path)
   and exit with their status, having imported neither torch nor Prefect;
4. otherwise (one process, or a rank): join the process group, run the flow (a Prefect flow
   on rank 0; on the other ranks the same function without Prefect, so every rank runs the
   same code and rank 0 alone logs and writes), leave the group;
5. the exit status and the end of the stage's MLflow runs: FINISHED (0), FAILED (1; 2 for
   params), KILLED (143 for SIGTERM, 130 for Ctrl-C, also when an error arose while a signal
   unwound the flow).

What each piece of process hygiene is for:
- SIGTERM unwinds (SystemExit 143), so Prefect marks its flow crashed and stops the
  temporary API server it started, and the stage marks its MLflow runs KILLED.
- The DVC repo lock (.dvc/tmp/lock): DVC releases it while a stage's command runs, so a
  second `dvc exp run` could rewrite params.yaml under a running study (its stages would
  train with the second run's values). The stage process (not its ranks) takes the lock for
  its lifetime; a second DVC command that needs it stops with "Unable to acquire lock".
- The reaper (pipeline/reaper.py), a small process in its own session, for the stage process
  and for rank 0 (which holds the MLflow runs): if its process is killed with SIGKILL it stops
  what that process started (Prefect's server, torchrun) and marks the open MLflow runs
  KILLED; if the `dvc` process that owns the stage dies, it terminates the stage, so no
  training outlives its `dvc repro`.
"""
from __future__ import annotations

import faulthandler
import functools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline import common

# Seconds a terminated stage gets to report the crash to Prefect and stop its server.
TERM_GRACE_S = 10
# Seconds a stage waits for the repo lock that a short DVC command (dvc status) may hold.
LOCK_WAIT_S = 10
SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}
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

_lock = None
_reaper: subprocess.Popen | None = None
_study = None  # the MLflow study this process opened (`end_with_stage`); `main` ends its runs


# ---- ranks and flows ----------------------------------------------------------------------
def is_rank0() -> bool:
    """The process that logs and writes: a single process, or global rank 0 under torchrun."""
    return os.environ.get("RANK", "0") == "0"


def flow(name: str, **options):
    """A stage's flow: a Prefect flow on rank 0, the plain function on the other ranks (the
    same collective work, no Prefect records). Prefect is imported at the call, after setup."""
    def wrap(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not is_rank0():
                return fn(*args, **kwargs)
            from prefect import flow as prefect_flow

            return prefect_flow(name=name, **options)(fn)(*args, **kwargs)
        return call
    return wrap


def task(**options):
    """A step of a flow: a Prefect task on rank 0 (results never cached: caching outputs is
    DVC's job), the plain function on the other ranks. No retries where ranks exchange data:
    a retry on rank 0 alone would desynchronise them."""
    def wrap(fn):
        @functools.cache
        def prefect_task():
            from prefect import task as make_task
            from prefect.cache_policies import NO_CACHE

            return make_task(cache_policy=NO_CACHE, **options)(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            return (prefect_task() if is_rank0() else fn)(*args, **kwargs)
        return call
    return wrap


# ---- the process's life -------------------------------------------------------------------
def main(stage: str, fn, *, key: tuple[str, str] | None = None, doc: str = "", ranks: bool = False) -> None:
    """Run a stage's flow `fn` as this process's whole life (see the module docstring).
    key: (option, help) of a foreach stage, `--<option> KEY`: fn(KEY) runs as stage@KEY.
    ranks: the stage runs data-parallel over runtime.nproc ranks per node."""
    from margrpo.config import ParamsError

    args = ()
    if key is not None:
        import argparse

        parser = argparse.ArgumentParser(description=doc.strip().splitlines()[0] if doc.strip() else None)
        parser.add_argument(f"--{key[0]}", required=True, help=key[1])
        args = (getattr(parser.parse_args(), key[0]),)
        stage = f"{stage}@{args[0]}"
    _setup()
    try:
        params = common.load()
    except ParamsError as err:
        _refuse(stage, err)
    if ranks and not _under_torchrun():
        from margrpo.ranks import launch

        try:
            if launch.ranks_per_node(params) * params.runtime.nnodes > 1:
                module = fn.__module__ if fn.__module__ != "__main__" else sys.modules["__main__"].__spec__.name
                _run(stage, lambda *_: sys.exit(launch.start_ranks(params, module, sys.argv[1:])), *args)
        except ParamsError as err:
            _refuse(stage, err)
    _run(stage, _in_ranks(fn, params.runtime.device) if ranks else fn, *args)


def _under_torchrun() -> bool:
    from margrpo.ranks.launch import under_torchrun

    return under_torchrun()


def _in_ranks(fn, device: str):
    """fn inside the process group of torchrun's ranks (no group in a single process)."""
    def call(*args):
        from margrpo.ranks.distributed import init, shutdown

        init(device)
        try:
            return fn(*args)
        finally:
            shutdown()
    return call


def _refuse(stage: str, err: Exception) -> None:
    sys.stderr.write(f"{stage}: {err}\n")
    sys.exit(2)


def _setup() -> None:
    """Signals, quiet defaults, and (by the process's role) the repo lock and the reaper."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a stage hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    # MLflow announces database creation and migrations at INFO on every new store.
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("prefect.task_runs").addFilter(_OneLineTaskErrors())
    # torchrun sets RANK in each rank: the stage process that launched torchrun holds the
    # lock; rank 0 opens the MLflow runs, so it gets the reaper that closes them.
    rank = os.environ.get("RANK")
    if rank is None:
        hold_repo_lock()
    if rank in (None, "0"):
        _start_reaper()


class _OneLineTaskErrors(logging.Filter):
    """Prefect logs an exception's traceback for the failed task and again for its flow; the
    task's record keeps its message (and retry notes) without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info, record.exc_text = None, None
        return True


def _run(stage: str, fn, *args) -> None:
    """fn(*args); end the stage's MLflow runs as FINISHED, FAILED or KILLED, and report a
    failure in one line (Prefect has already logged the traceback of an exception raised
    inside the flow, once)."""
    from margrpo.config import ParamsError

    who = stage if is_rank0() else f"{stage} (rank {os.environ['RANK']})"
    try:
        fn(*args)
    except (SystemExit, KeyboardInterrupt) as err:
        _end_study("KILLED")
        raise SystemExit(130 if isinstance(err, KeyboardInterrupt) else err.code) from None
    except ParamsError as err:
        _end_study("FAILED")
        _refuse(who, err)
    except Exception as err:  # noqa: BLE001 - reported in one line, traceback already shown
        if _unwinding(err):  # an error raised while a signal unwound the flow
            _end_study("KILLED")
            sys.stderr.write(f"{who}: killed (SIGTERM; while stopping: {type(err).__name__}: {err})\n")
            sys.exit(143)
        _end_study("FAILED")
        sys.stderr.write(f"{who}: failed: {type(err).__name__}: {err}\n")
        sys.exit(1)
    _end_study("FINISHED")


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


# ---- MLflow runs --------------------------------------------------------------------------
def open_study(params):
    """The study's MLflow parent run (RUNNING while this stage runs); `main` ends its runs
    with the stage's outcome. Rank 0 alone opens it."""
    from margrpo.tracking.runs import (Study, artifact_root, git_revision, params_hash, study_id, study_name,
                                       tracking_uri)

    root = common.tracking_root()
    rev = git_revision(root)
    text = common.PARAMS_FILE.read_text()
    tags = {
        "git.revision": rev,
        "mlflow.source.git.commit": rev,
        "dvc.exp_name": common.exp_name(),
        "params.hash": params_hash(text),
    }
    uri = tracking_uri(root)
    return end_with_stage(Study(uri, study_id(root, text), params.model_dump(mode="json"), tags, artifact_root(root),
                                name=study_name(common.exp_name(), rev), watcher=watch_runs(uri)))


def watch_runs(uri: str):
    """The watcher a Study tells each run it opens and closes: the reaper marks the runs
    still open KILLED if this process dies without closing them."""
    _tell_reaper(uri=uri)
    return lambda what, run_id: _tell_reaper(**{what: run_id})


def end_with_stage(study):
    """`main` ends this study's runs with the stage's outcome; returns the study."""
    global _study
    _study = study
    return study


def _end_study(status: str) -> None:
    if _study is not None:
        _study.abort(status)


# ---- signals ------------------------------------------------------------------------------
def _hard_exit(*_) -> None:
    import psutil  # a DVC dependency

    from pipeline.reaper import is_reaper

    # Not the reapers (this stage's, and rank 0's under torchrun): they close the MLflow
    # runs once their stage has gone.
    for child in psutil.Process().children(recursive=True):
        if not is_reaper(child):
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


# ---- the repo lock ------------------------------------------------------------------------
def hold_repo_lock(root: Path = Path(".")) -> None:
    """Take DVC's repo lock for this process's lifetime (only when DVC runs the stage)."""
    global _lock
    if not os.environ.get("DVC_STAGE") or not (root / ".dvc").is_dir():
        return
    import zc.lockfile  # a DVC dependency; DVC's own lock uses it

    path = root / ".dvc" / "tmp" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            _lock = zc.lockfile.LockFile(str(path))
            return
        except zc.lockfile.LockError:
            if time.monotonic() > deadline:
                sys.stderr.write(f"{os.environ['DVC_STAGE']}: another DVC command holds {path} "
                                 f"(see the pid in that file); wait for it to finish and rerun\n")
                sys.exit(3)
            time.sleep(0.2)


# ---- the reaper ---------------------------------------------------------------------------
def _owner_pid() -> int | None:
    """The `dvc` process that runs this stage (DVC starts it through $SHELL -c, which may or
    may not exec), or None when the stage was started by hand."""
    if not os.environ.get("DVC_STAGE"):
        return None
    import psutil

    parent = psutil.Process().parent()
    while parent is not None and parent.name() in SHELLS:
        parent = parent.parent()
    if parent is None:
        return None
    return parent.pid if "dvc" in " ".join(parent.cmdline()) else None


def _start_reaper() -> None:
    global _reaper
    args = [sys.executable, "-m", "pipeline.reaper", str(os.getpid())]
    owner = _owner_pid()
    if owner is not None:
        args.append(str(owner))
    # Its own session: a SIGKILL sent to the stage's process group must not take it along.
    _reaper = subprocess.Popen(args, stdin=subprocess.PIPE, start_new_session=True,
                               cwd=Path(__file__).resolve().parents[1])


def _tell_reaper(**message) -> None:
    """One JSON line to the reaper (run ids it must close if this process dies)."""
    if _reaper is None or _reaper.stdin is None:
        return
    try:
        _reaper.stdin.write((json.dumps(message) + "\n").encode())
        _reaper.stdin.flush()
    except (BrokenPipeError, ValueError):
        pass

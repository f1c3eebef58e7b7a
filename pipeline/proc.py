"""Process hygiene of a stage: signals, the repo lock, and the reaper that outlives a kill.

`common.preamble()` calls `start()` first thing in every stage process, before Prefect is
imported. What each piece is for:
- SIGTERM unwinds (SystemExit 143), so Prefect marks its flow crashed and stops the
  temporary API server it started, and the stage marks its MLflow runs KILLED.
- The DVC repo lock (.dvc/tmp/lock): DVC releases it while a stage's command runs, so a
  second `dvc exp run` could rewrite params.yaml under a running study (its stages would
  train with the second run's values). The stage takes the lock for its lifetime; a second
  DVC command that needs it stops with "Unable to acquire lock" before touching anything.
- The reaper (pipeline/reaper.py), a small process in its own session: if the stage is
  killed with SIGKILL it stops what the stage started (Prefect's server) and marks the
  stage's open MLflow runs KILLED; if the `dvc` process that owns the stage dies, it
  terminates the stage, so no training outlives its `dvc repro`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Seconds a terminated stage gets to report the crash to Prefect and stop its server.
TERM_GRACE_S = 10
# Seconds a stage waits for the repo lock that a short DVC command (dvc status) may hold.
LOCK_WAIT_S = 10
SHELLS = {"sh", "bash", "dash", "zsh", "fish", "ksh"}

_lock = None
_reaper: subprocess.Popen | None = None


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


def owner_pid() -> int | None:
    """The `dvc` process that runs this stage (DVC starts it through $SHELL -c, which may or
    may not exec), or None when the stage was started by hand."""
    if not os.environ.get("DVC_STAGE"):
        return None
    import psutil

    proc = psutil.Process().parent()
    while proc is not None and proc.name() in SHELLS:
        proc = proc.parent()
    if proc is None:
        return None
    cmdline = " ".join(proc.cmdline())
    return proc.pid if "dvc" in cmdline else None


def start_reaper() -> None:
    global _reaper
    args = [sys.executable, "-m", "pipeline.reaper", str(os.getpid())]
    owner = owner_pid()
    if owner is not None:
        args.append(str(owner))
    # Its own session: a SIGKILL sent to the stage's process group must not take it along.
    _reaper = subprocess.Popen(args, stdin=subprocess.PIPE, start_new_session=True,
                               cwd=Path(__file__).resolve().parents[1])


def tell_reaper(**message) -> None:
    """One JSON line to the reaper (run ids it must close if this process dies)."""
    if _reaper is None or _reaper.stdin is None:
        return
    try:
        _reaper.stdin.write((json.dumps(message) + "\n").encode())
        _reaper.stdin.flush()
    except (BrokenPipeError, ValueError):
        pass


def start() -> None:
    signal.signal(signal.SIGTERM, _on_sigterm)
    # torchrun sets RANK in each rank: the stage process that launched torchrun holds the
    # lock; rank 0 opens the MLflow runs, so it gets the reaper that closes them.
    rank = os.environ.get("RANK")
    if rank is None:
        hold_repo_lock()
    if rank in (None, "0"):
        start_reaper()

"""The reaper of one stage process: `python -m pipeline.reaper <stage pid> [<dvc pid>]`.

Started by pipeline/proc.py in its own session, with the stage's messages on stdin (JSON
lines: {"uri": tracking uri}, {"open": run id}, {"close": run id}). It polls twice a second:
- it remembers the stage's descendants (Prefect's temporary API server, data workers);
- if the owning `dvc` process is gone while the stage runs, it sends the stage SIGTERM
  (then SIGKILL after the stage's grace period), so no training outlives `dvc repro`.
When stdin reaches end of file the stage has exited, however it died: the reaper stops
the descendants still alive (the stage's children first; never another reaper), marks
the runs still open KILLED, and exits. A clean stage has closed its runs and stopped its
server, and the reaper then has nothing to do.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

import psutil

POLL_S = 0.5
# After SIGTERM the stage gets proc.TERM_GRACE_S to unwind; then SIGKILL.
KILL_AFTER_S = 15


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def is_reaper(proc: psutil.Process) -> bool:
    try:
        return "pipeline.reaper" in proc.cmdline()
    except psutil.Error:
        return False


def _descendants(stage: psutil.Process, recursive: bool = True) -> dict[int, psutil.Process]:
    """The stage's descendants except reapers: with torchrun ranks, rank 0 has a reaper of
    its own (it holds the MLflow runs), which must outlive rank 0 to close them."""
    try:
        return {p.pid: p for p in stage.children(recursive=recursive) if p.pid != os.getpid() and not is_reaper(p)}
    except psutil.Error:
        return {}


def _stop(procs) -> None:
    procs = [p for p in procs if _alive(p)]  # is_running() also checks the create time
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    # A torchrun rank that gets SIGTERM here unwinds like a stage (it marks its runs KILLED
    # within proc.TERM_GRACE_S), so it gets the same grace as the stage before SIGKILL.
    _, alive = psutil.wait_procs(procs, timeout=KILL_AFTER_S)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


def _mark_killed(uri: str | None, run_ids: list[str]) -> None:
    if not uri or not run_ids:
        return
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    for run_id in run_ids:
        try:
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status="KILLED")
        except Exception as err:  # noqa: BLE001 - best effort, say what was not closed
            sys.stderr.write(f"reaper: could not mark MLflow run {run_id} KILLED: {err}\n")


def _read(fd: int, state: dict, timeout: float) -> bool:
    """Apply the messages that arrive within `timeout` s; False at end of file, or when
    nothing arrived and timeout is 0 (drained)."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return timeout > 0
    chunk = os.read(fd, 65536)
    if not chunk:
        return False
    *lines, state["buffer"] = (state["buffer"] + chunk).split(b"\n")
    for line in lines:
        msg = json.loads(line)
        state["uri"] = msg.get("uri", state["uri"])
        if "open" in msg and msg["open"] not in state["runs"]:
            state["runs"].append(msg["open"])
        if "close" in msg and msg["close"] in state["runs"]:
            state["runs"].remove(msg["close"])
    return True


def main(argv: list[str]) -> None:
    # Ctrl-C and a `kill` of the process group are meant for the stage; the reaper leaves
    # when the stage has gone.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stage = psutil.Process(int(argv[0]))
    owner = psutil.Process(int(argv[1])) if len(argv) > 1 else None
    fd = sys.stdin.fileno()
    state = {"uri": None, "runs": [], "buffer": b""}
    # children: the stage's own children (torchrun, Prefect's server); known: all descendants.
    children, known, termed_at = {}, {}, None
    while _read(fd, state, POLL_S):
        if not _alive(stage):  # exited; a forked child may still hold the pipe open
            while _read(fd, state, 0):
                pass
            break
        children.update(_descendants(stage, recursive=False))
        known.update(_descendants(stage))
        if owner is not None and not _alive(owner) and _alive(stage):
            now = time.monotonic()
            if termed_at is None:
                sys.stderr.write(f"reaper: the dvc process {owner.pid} is gone; stopping stage process {stage.pid}\n")
                stage.terminate()
                termed_at = now
            elif now - termed_at > KILL_AFTER_S:
                stage.kill()
    psutil.wait_procs([stage], timeout=KILL_AFTER_S)
    # Children first, then what is left: torchrun, terminated, stops its ranks itself, and
    # rank 0 then unwinds with its Prefect server still up (its flow ends Crashed, its runs
    # KILLED) instead of losing the server under it.
    _stop(children.values())
    _stop(known.values())
    _mark_killed(state["uri"], state["runs"])


if __name__ == "__main__":
    main(sys.argv[1:])

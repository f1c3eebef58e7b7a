"""Starting ranks under torchrun, without importing torch in the starting process.

A data-parallel stage's own process (`python -m pipeline.train ...`) only validates
params.yaml and starts its ranks (`start_ranks`): it imports neither torch nor Prefect,
which only the ranks use (4.1 s and 2.3 s of imports, timed on 2 busy cores). The helpers here are
torch-free for that reason; margrpo.rl.distributed re-exports them.

`python -m margrpo.rl.launch <torchrun arguments>`: torchrun, with a failed rank reported
in one line. The ranks have already printed their own error (pipeline/common.run: one line
plus Prefect's traceback on rank 0); torchrun's uncaught ChildFailedError would add a
second traceback and a box of "<N/A>" fields. Exits with the first failed rank's status.
Stopped by a signal (the stage was killed), torchrun has sent its ranks SIGTERM and waited
for them; that too is one line, and the exit status is 128 + the signal number.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Sequence


def under_torchrun() -> bool:
    """True in a process started by torchrun (it sets these variables for every rank)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_shardable(prompts_per_step: int, nproc: int) -> None:
    """Each rank takes whole groups: the prompts of a step must split evenly."""
    if prompts_per_step % nproc:
        raise ValueError(f"train.prompts_per_step={prompts_per_step} does not split over runtime.nproc={nproc} "
                         "processes (each takes whole groups, so that group advantages stay exact); "
                         "make train.prompts_per_step a multiple of runtime.nproc")


def torchrun_command(nproc: int, module: str, args: Sequence[str]) -> list[str]:
    """torchrun (through this module: a failed rank in one line) starting nproc ranks of
    `python -m module args` on this node."""
    return [sys.executable, "-m", "margrpo.rl.launch", "--standalone", f"--nproc_per_node={nproc}",
            "-m", module, *args]


def start_ranks(nproc: int, module: str, args: Sequence[str]) -> int:
    """Run nproc ranks of `python -m module args` under torchrun; their exit status. A
    signal or Ctrl-C here stops torchrun, which stops its ranks (SIGTERM) and waits."""
    env = dict(os.environ)
    # Each rank's share of the cores for its intra-op threads. Left unset, torchrun sets 1
    # and prints a four-line warning into every stage's output.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.Popen(torchrun_command(nproc, module, args), env=env)
    try:
        return proc.wait()
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
        raise


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        sys.stderr.write(f"{err.name}: rank {rank} exited with status {failure.exitcode}\n")
        sys.exit(failure.exitcode if isinstance(failure.exitcode, int) and failure.exitcode > 0 else 1)
    except SignalException as err:
        sys.stderr.write(f"torchrun: stopped by {err.sigval.name}; its ranks were stopped\n")
        sys.exit(128 + int(err.sigval))


if __name__ == "__main__":
    main()

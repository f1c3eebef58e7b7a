"""`python -m margrpo.rl.launch <torchrun arguments>`: torchrun, with a failed rank reported
in one line. The ranks have already printed their own error (pipeline/common.run: one line
plus Prefect's traceback on rank 0); torchrun's uncaught ChildFailedError would add a
second traceback and a box of "<N/A>" fields. Exits with the first failed rank's status.
Stopped by a signal (the stage was killed), torchrun has sent its ranks SIGTERM and waited
for them; that too is one line, and the exit status is 128 + the signal number.
"""
from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def main(argv: list[str] | None = None) -> None:
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

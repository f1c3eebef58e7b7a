"""How many ranks a data-parallel stage runs, and starting them under torchrun; torch-free.

A data-parallel stage (train, evaluate) with more than one rank runs as torchrun ranks: the
stage's own process (`python -m pipeline.train ...`) validates params.yaml, starts torchrun
(`start_ranks`) and exits with its status. It imports neither torch nor Prefect (4.1 s and
2.3 s of imports, timed on 2 busy cores); only the ranks do, so nothing here imports torch.

Ranks per node (`ranks_per_node`): runtime.nproc, or with `auto` one rank per visible GPU
when the model computes on CUDA and CPU_RANKS on the CPU, lowered to the largest count whose
ranks over all nodes split every method's prompts per step into whole groups.
`rank_problems` are the same rules as (dotted key, problem, fix) for pipeline/validate.py,
which refuses a count that does not fit the machine or the batch before any stage starts.

Several nodes (runtime.nnodes > 1): a scheduler starts the same stage process on every node
(`srun python -m pipeline.train --method grpo`); their torchruns meet at torchrun's own c10d
rendezvous (`rendezvous_endpoint`: runtime.rdzv_endpoint, else $MASTER_ADDR:$MASTER_PORT),
hosted by the torchrun on the endpoint's machine. Global rank 0 alone logs and writes, and
every rank reads and resumes from the same files, so every node must see the same workspace
(a shared filesystem). One node uses torchrun's standalone rendezvous on a free local port.

`python -m margrpo.ranks.launch <torchrun arguments>`: torchrun, with a failed rank reported
in one line. The ranks have already printed their own error (pipeline/proc.py: one line
plus Prefect's traceback on rank 0); torchrun's uncaught ChildFailedError would add a
second traceback and a box of "<N/A>" fields. Exits with the first failed rank's status.
Stopped by a signal (the stage was killed), torchrun has sent its ranks SIGTERM and waited
for them; that too is one line, and the exit status is 128 + the signal number.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from margrpo.paramfile import ParamsError

# Ranks per node of `runtime.nproc: auto` on the CPU: two single-thread ranks trained 3-4x
# faster than one two-thread process on 2 shared cores (docs/tuning.md). A fixed count, not
# the core count: the rank count changes a run's numbers by float rounding (gradient sums in
# another order), so the same params give the same numbers on any CPU machine.
CPU_RANKS = 2
# torchrun's default port for a rendezvous endpoint given without one
DEFAULT_PORT = 29500


def under_torchrun() -> bool:
    """True in a process started by torchrun (it sets these variables for every rank)."""
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def check_shardable(prompts_per_step: int, nproc: int) -> None:
    """Each rank takes whole groups: the prompts of a step must split evenly."""
    if prompts_per_step % nproc:
        raise ValueError(f"train.prompts_per_step={prompts_per_step} does not split over runtime.nproc={nproc} "
                         "processes (each takes whole groups, so that group advantages stay exact); "
                         "make train.prompts_per_step a multiple of runtime.nproc")


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use, without importing torch: the driver's list
    (/proc/driver/nvidia/gpus, else `nvidia-smi -L`), cut to $CUDA_VISIBLE_DEVICES as CUDA
    reads it (the entries before the first invalid one)."""
    proc_dir = Path("/proc/driver/nvidia/gpus")
    if proc_dir.is_dir():
        present = sum(1 for _ in proc_dir.iterdir())
    elif shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        present = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    else:
        present = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    listed = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        listed += 1
    return min(present, listed)


def _shares(params) -> dict[str, int]:
    """Prompts per training step of every method (each rank takes whole groups of them)."""
    return {m: params.train_for(m).prompts_per_step for m in params.methods}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _plan(params) -> tuple[int, list[tuple[str, str, str]]]:
    """(ranks per node, the problems that stop the stage from starting: (key, problem, fix))."""
    rt = params.runtime
    gpus = visible_gpus() if rt.device != "cpu" else 0
    on_cuda = rt.device == "cuda" or (rt.device == "auto" and gpus > 0)
    shares = _shares(params)
    common = math.gcd(*shares.values())
    if rt.nproc == "auto":
        cap = max(gpus, 1) if on_cuda else CPU_RANKS
        fits = [d for d in range(1, cap + 1) if common % (d * rt.nnodes) == 0]
        if fits:
            return fits[-1], []
        return 1, [("runtime.nnodes", f"{rt.nnodes} nodes cannot split the prompts of a training step "
                    f"({common} for every method, train.prompts_per_step x the method's batch_factor) into whole "
                    "groups per rank", f"use one of {', '.join(map(str, _divisors(common)))} nodes")]
    nproc, problems = rt.nproc, []
    # One rank per GPU (NCCL); a single rank on a GPU the probe missed is left to the stage's
    # own device check (margrpo.models.device.resolve_device).
    if on_cuda and nproc > max(gpus, 1):
        problems.append(("runtime.nproc", f"{nproc} ranks need one GPU each and this machine shows {gpus} "
                         f"(runtime.device: {rt.device})",
                         f"set runtime.nproc to auto (one rank per GPU), to at most {gpus}, or runtime.device to cpu"
                         if gpus else "set runtime.nproc to auto, or runtime.device to cpu"))
    world = nproc * rt.nnodes
    by_size: dict[int, list[str]] = {}
    for method, n in shares.items():
        if n % world:
            by_size.setdefault(n, []).append(method)
    if by_size:
        what = "; ".join(f"{n} for {', '.join(ms)}" for n, ms in by_size.items())
        ranks = f"{nproc} ranks" if rt.nnodes == 1 else f"{nproc} ranks on each of {rt.nnodes} nodes"
        problems.append(("runtime.nproc", f"{ranks} cannot split the prompts of a training step ({what}; "
                         f"train.prompts_per_step={params.train.prompts_per_step} x the method's batch_factor): each "
                         "rank takes whole groups, so that group advantages stay exact",
                         f"set runtime.nproc to one of "
                         f"{', '.join(str(d) for d in _divisors(common) if common % (d * rt.nnodes) == 0)} or auto, "
                         f"or train.prompts_per_step to a multiple of {world}"))
    return nproc, problems


def rank_problems(params) -> list[tuple[str, str, str]]:
    """(dotted key, problem, fix) for each way the ranks of params do not fit this machine or
    the training batch; pipeline/validate.py refuses them before any stage starts."""
    problems = _plan(params)[1]
    if params.runtime.nnodes > 1:
        try:
            rendezvous_endpoint(params.runtime)
        except ParamsError as err:
            problems.append(("runtime.rdzv_endpoint", str(err).partition(": ")[2],
                             "set it to host:port of the first node, or export MASTER_ADDR (and MASTER_PORT)"))
    return problems


def ranks_per_node(params) -> int:
    """The ranks this node runs; ParamsError naming the key when they cannot run here."""
    nproc, problems = _plan(params)
    if problems:
        raise ParamsError("\n".join(f"{key}: {problem}\n    fix: {fix}" for key, problem, fix in problems))
    return nproc


def rendezvous_endpoint(runtime) -> str:
    """host:port of the c10d rendezvous of a multi-node run: runtime.rdzv_endpoint, else
    $MASTER_ADDR:$MASTER_PORT (port 29500 when unset), as a job script exports them."""
    endpoint = runtime.rdzv_endpoint or os.environ.get("MASTER_ADDR", "")
    if not endpoint:
        raise ParamsError(f"runtime.rdzv_endpoint: {runtime.nnodes} nodes need a rendezvous endpoint; it is empty "
                          "and $MASTER_ADDR is not set")
    if not runtime.rdzv_endpoint:
        endpoint += f":{os.environ.get('MASTER_PORT', DEFAULT_PORT)}"
    return endpoint


def torchrun_command(nproc: int, module: str, args: Sequence[str], nnodes: int = 1,
                     endpoint: str | None = None) -> list[str]:
    """torchrun (through this module: a failed rank in one line) starting nproc ranks of
    `python -m module args` on this node: a standalone rendezvous for one node, else the
    c10d rendezvous at `endpoint` that the other nodes' identical commands join."""
    if nnodes == 1:
        where = ["--standalone"]
    else:
        # The run id names this stage: every node of it computes the same one.
        run_id = "-".join([module, *args]).replace("/", "_")
        where = [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}"]
    return [sys.executable, "-m", "margrpo.ranks.launch", *where, f"--nproc-per-node={nproc}", "-m", module, *args]


def start_ranks(params, module: str, args: Sequence[str]) -> int:
    """Run this node's ranks of `python -m module args` under torchrun; their exit status. A
    signal or Ctrl-C here stops torchrun, which stops its ranks (SIGTERM) and waits."""
    nproc, rt = ranks_per_node(params), params.runtime
    endpoint = rendezvous_endpoint(rt) if rt.nnodes > 1 else None
    env = dict(os.environ)
    # Each rank's share of the cores for its intra-op threads. Left unset, torchrun sets 1
    # and prints a four-line warning into every stage's output.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.Popen(torchrun_command(nproc, module, args, rt.nnodes, endpoint), env=env)
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

"""Benchmark: training step times and host syncs per method, side by side in one process.

    .venv/bin/python benchmarks/step_time.py [--params params.yaml] [--steps 6] \
        [--methods grpo_frozen,mar_grpo] [--device auto] [--dtype float32] \
        [--threads 1] [--syncs-detail 10] [--flops] [-S train.group_size=4]

For a profile, merge it into a copy first (scripts/gpu_check.sh does):
    cp params.yaml /tmp/p.yaml && python -m pipeline.profile params_gpu.yaml --params /tmp/p.yaml --apply

Each method after the first is compared with the first (any method of params.yaml; the
default pair differs only by the multi-trajectory estimate, both with a frozen head). All
trainers start from the same base model and alternate steps, so machine load hits them
alike; a step is rollout + reward + selection/estimator draws + loss + update; step 0 is a
warm-up and the gradient probe is off. Per step it prints the median wall-clock seconds and
the median CPU seconds of this process (on a machine shared with other jobs the wall clock
also measures them; the CPU seconds are this process's own work), and the ratios of both.
On the CPU, --threads 1 is the study's setting (runtime.nproc auto runs two single-thread
ranks on two cores) and the stable one on a shared machine: two threads that wait for each
other spin, so another job's load inflates even their CPU seconds.

Host syncs: one more step per method under margrpo.hostsync.HostSyncCounter, which counts
the reads of device values the project's code makes (item, tolist, bool / float / int,
nonzero, boolean-mask indexing, copies to the CPU), on any device, the CPU included; the
busiest sites print with --syncs-detail. On CUDA the same step also runs under
torch.cuda.set_sync_debug_mode("warn"), whose warnings (every synchronising CUDA call,
those inside torch included) are counted too.

FLOPs (--flops): one more step per method under torch.utils.flop_counter.FlopCounterMode,
which counts the floating-point operations of matmuls, convolutions and attention (the
elementwise ops it leaves out are a small share here), split into the batch (rollout,
reward, token plan: Trainer.collect) and the loss (forward and backward:
Trainer.compute_grads); the counted step does not update the weights. Counts do not depend
on the machine's load, so they also run on a busy machine (--steps 0 skips the timing),
and they scale linearly with the batch. With them, the head's operations per token row at
one head step, split into the part the chains of a token share (condition on t and z,
computed once per token) and the part each chain repeats (apply), which bound what M more
chains cost: about M x apply / (condition + apply) of the rollout head's operations.

Targets: MAR-GRPO / GRPO-frozen <= 1.3 at num_trajectories=4, k=0.3; a 512-image step
<= 1.0 s on one H200.
"""
from __future__ import annotations

import argparse
import contextlib
import time
import warnings

import torch

from margrpo.benchtools import add_runtime_args, count_flops, head_flops, median, report_memory, resolve, sync
from margrpo.config import load_params, parse_overrides
from margrpo.hostsync import HostSyncCounter
from margrpo.training.loop import train_step
from margrpo.training.trainer import Trainer
from margrpo.world.prompts import make_prompt_set


def timed_step(trainer: Trainer, device: torch.device) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process, rollout seconds) of one training step."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    metrics, _ = train_step(trainer)
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu, metrics["time/rollout"]


def count_syncs(trainer: Trainer, device: torch.device) -> tuple[HostSyncCounter, int | None]:
    """One step under the counter (and, on CUDA, the sync debug mode's warnings)."""
    # The samplers' noise tables are CPU tensors in every run: reading them costs nothing.
    tables = [v for pol in (trainer.policy, trainer.ref) if pol is not None
              for v in vars(pol.sampler).values() if torch.is_tensor(v)]
    cuda_syncs = None
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            stack.callback(torch.cuda.set_sync_debug_mode, "default")
        with HostSyncCounter(tables) as counter:
            train_step(trainer)
    if device.type == "cuda":
        cuda_syncs = sum("synchroniz" in str(w.message) for w in caught)
    return counter, cuda_syncs


def print_flops(trainers: dict[str, Trainer], names: list[str]) -> None:
    counts = {n: count_flops(trainers[n])[:2] for n in names}
    b = trainers[names[0]].tcfg.prompts_per_step * trainers[names[0]].tcfg.group_size
    print(f"FLOPs per step of {b} images (torch.utils.flop_counter; linear in the batch):")
    for n in names:
        c, l = counts[n]
        print(f"{n:>12}: {(c + l) / 1e9:8.2f} GFLOP = batch {c / 1e9:.2f} + loss {l / 1e9:.2f}")
    base_c, base_l = counts[names[0]]
    for n in names[1:]:
        c, l = counts[n]
        print(f"FLOP ratio {n}/{names[0]}: {(c + l) / (base_c + base_l):.2f} "
              f"(batch {c / base_c:.2f}, loss {l / base_l:.2f}; target <= 1.3)")
    split = head_flops(trainers[names[0]].policy)
    if split:
        cond, app = split
        print(f"head per token row and head step: condition {cond / 1e6:.3f} MFLOP (shared by a token's chains), "
              f"apply {app / 1e6:.3f} MFLOP (per chain): M more chains cost M x {app / (cond + app):.2f} "
              f"of the rollout head's operations")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--methods", default="grpo_frozen,mar_grpo")
    ap.add_argument("--flops", action="store_true", help="also count each method's FLOPs per step")
    ap.add_argument("--syncs-detail", type=int, default=0, metavar="N", help="print the N busiest read sites")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (0: torch's default); 1 is what each of the study's CPU ranks uses")
    ap.add_argument("-S", dest="sets", action="append", default=[], help="dotted key=value override")
    add_runtime_args(ap)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = resolve(a)
    params = load_params(a.params, parse_overrides(a.sets) | {"runtime.device": a.device, "runtime.dtype": a.dtype})
    prompts = make_prompt_set("train", params.world.train_prompts_per_tag, params.world.seed)
    names = a.methods.split(",")
    trainers = {n: Trainer.from_params(params, n, 0, prompts) for n in names}
    for tr in trainers.values():  # the probe is an occasional diagnostic, not the step
        tr.tcfg = tr.tcfg.model_copy(update={"grad_probe_every": 0})
    t = params.train
    print(f"{device} ({a.dtype}, {torch.get_num_threads()} threads); batch: {t.prompts_per_step} prompts x "
          f"{t.group_size} images; loss on {t.loss_ar_steps or 'all'} AR steps x "
          f"{f'an SDE window of {t.sde_window} ({t.sde_window_mode})' if t.sde_window else f'{t.loss_head_steps}'} head steps; "
          f"M={params.num_trajectories}, k={params.k}, tau={params.tau}")
    times: dict[str, list[tuple[float, float, float]]] = {n: [] for n in trainers}
    for s in range(a.steps + 1):
        for n, tr in trainers.items():
            dt = timed_step(tr, device)
            if s > 0:  # step 0 is warm-up
                times[n].append(dt)

    def med(n: str, i: int) -> float:
        return median([x[i] for x in times[n]])

    for n in names if a.steps else []:
        print(f"{n:>12}: step {med(n, 0):.3f} s wall, {med(n, 1):.3f} s CPU (rollout {med(n, 2):.3f} s)")
    for n in names[1:] if a.steps else []:
        print(f"ratio {n}/{names[0]}: {med(n, 0) / med(names[0], 0):.2f} wall, "
              f"{med(n, 1) / med(names[0], 1):.2f} CPU (target <= 1.3)")
    if a.flops:
        print_flops(trainers, names)
    for n in names:
        counter, cuda_syncs = count_syncs(trainers[n], device)
        extra = f", {cuda_syncs} CUDA syncs (sync debug mode)" if cuda_syncs is not None else ""
        print(f"{n:>12}: {counter.total} host syncs per step{extra}")
        for site, k in counter.sites.most_common(a.syncs_detail):
            print(f"{'':>14}{k:>4}  {site}")
    report_memory(device)


if __name__ == "__main__":
    main()

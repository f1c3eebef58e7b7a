"""What the benchmarks (benchmarks/) share: device / precision flags, timing with the
device's queue drained, peak memory, and the FLOP counts of a training step and of the head
(benchmarks/step_time.py --flops; tests/test_bench_flops.py checks them).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

import torch
from torch.utils.flop_counter import FlopCounterMode

from margrpo.models.device import DTYPES, peak_memory_line, resolve_device

if TYPE_CHECKING:
    from margrpo.training.trainer import Batch, Trainer


def add_runtime_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="runtime.device")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="runtime.dtype")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    """Wall-clock seconds of fn(), with the device's queue drained before and after."""
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def report_memory(device: torch.device) -> None:
    line = peak_memory_line(device)
    if line:
        print(line)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def resolve(args) -> torch.device:
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return device


def count_flops(trainer: Trainer) -> tuple[int, int, Batch]:
    """(FLOPs of Trainer.collect, FLOPs of Trainer.compute_grads, the batch) of one more batch."""
    with FlopCounterMode(display=False) as collect:
        batch = trainer.collect()
    with FlopCounterMode(display=False) as loss:
        trainer.compute_grads(batch)
    trainer.opt.zero_grad(set_to_none=True)
    return collect.get_total_flops(), loss.get_total_flops(), batch


def head_flops(policy) -> tuple[int, int] | None:
    """(condition, apply) FLOPs of the head for one token row at one head step, or None for a
    head that does not split (models/chains.py shared_guided_output)."""
    if not hasattr(policy, "head_condition"):
        return None
    dev = next(policy.parameters()).device
    t = torch.full((1,), policy.sampler.time_input(0), device=dev)
    z = torch.zeros(1, policy.config.cond_dim, device=dev)  # TinyMAR, the one split head
    x = torch.zeros(1, policy.token_dim, device=dev)
    with torch.no_grad(), FlopCounterMode(display=False) as cond_fc:
        cond = policy.head_condition(t, z)
    with torch.no_grad(), FlopCounterMode(display=False) as apply_fc:
        policy.head_apply(x, cond)
    return cond_fc.get_total_flops(), apply_fc.get_total_flops()

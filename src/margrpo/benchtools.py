"""What the benchmark scripts share: device / precision flags, timing with the device's
queue drained, and peak memory.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from margrpo.models.device import DTYPES, peak_memory_line, resolve_device

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

"""What the benchmark scripts share: device / precision flags, timing with the device's
queue drained, peak memory, and the legacy rollout noise.

The legacy noise is the CPU-only code's per-image randomness (one torch.Generator per image
and AR step, seeded from the image seed; speculative draws continue the committed
generator; the token order from a randperm per image). It is kept here only as the
reference the benchmarks time the vectorised counter-based draws (models/noise.py)
against: `with legacy_rollout(): model.rollout(...)` runs the old path and reproduces the
old code's images bit for bit on the CPU. Nothing else uses it.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch

from margrpo.models import noise
from margrpo.models.device import DTYPES, peak_memory_line, resolve_device

_SEED_MIX = 0x9E3779B97F4A7C15  # the old code's (seed, step) spreading constant
_SEED_MOD = 2**63 - 1


def _step_seed(seed: int, step: int) -> int:
    return (int(seed) + (step + 1) * _SEED_MIX) % _SEED_MOD


class _LegacyNoise:
    """Drop-in for noise.chain_noise / noise.token_order with the old per-image generators."""

    def __init__(self) -> None:
        self.gens: list[torch.Generator] = []

    def chain_noise(self, seeds, ar_step, tokens, num_states, dim, stream=noise.COMMITTED):
        if stream == noise.COMMITTED:  # the old code drew committed noise first, then speculative
            self.gens = [torch.Generator().manual_seed(_step_seed(s, ar_step)) for s in seeds.tolist()]
        n = tokens.shape[1]
        draws = [torch.randn(num_states, n, dim, generator=g) for g in self.gens]
        return torch.stack(draws, dim=1).to(tokens.device)

    def token_order(self, seeds, num_tokens, device=None):
        perms = [torch.randperm(num_tokens, generator=torch.Generator().manual_seed(s)) for s in seeds.tolist()]
        return torch.stack(perms).to(device or seeds.device)


@contextlib.contextmanager
def legacy_rollout():
    """Rollouts inside draw their randomness the old way (per-image generators, on the CPU)."""
    legacy = _LegacyNoise()
    with mock.patch.object(noise, "chain_noise", legacy.chain_noise), \
            mock.patch.object(noise, "token_order", legacy.token_order):
        yield


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

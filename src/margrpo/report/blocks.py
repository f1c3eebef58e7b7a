"""Claims 1-2 of a one-seed run: consecutive blocks of its windows stand in for seeds.

Kept apart from report/curves.py, which the train stages read (dvc.yaml): a change here
rebuilds the report, not the study.
"""
from __future__ import annotations

import math

from margrpo.report.curves import SPARSE_PREFIXES, WINDOW, window_mean

# Blocks per window: 5 blocks of 10 steps in a 200-step run's 50-step window.
BLOCKS = 5


def block_stats(hist: list[dict], blocks: int = BLOCKS) -> dict[str, dict[str, list[float]]]:
    """curves.train_stats of one seed's run with `blocks` consecutive blocks of each window
    (the first and last WINDOW of its steps) as the replicates: 'final' the block means of
    the final window, 'growth' final block i − early block i, 'reward/peak_drop' the run's
    one value. Steps within a block are averaged, so the blocks' spread measures the
    step-to-step noise of one run (a trend within a window widens it); it says nothing of
    the seed-to-seed spread. Dense keys only."""
    keys = sorted({k for r in hist for k, v in r.items() if k != "step" and _finite(v)
                   and not k.startswith(SPARSE_PREFIXES)})
    final: dict[str, list[float]] = {}
    growth: dict[str, list[float]] = {}
    for k in keys:
        vals = [r[k] for r in hist if _finite(r.get(k))]
        n = max(1, math.ceil(WINDOW * len(vals)))  # the window of curves.window_mean
        f, e = _blocks(vals[-n:], blocks), _blocks(vals[:n], blocks)
        if f:
            final[k] = f
        if f and len(e) == len(f):
            growth[k] = [a - b for a, b in zip(f, e)]
    if "reward/mean" in final:
        rewards = [r["reward/mean"] for r in hist if _finite(r.get("reward/mean"))]
        final["reward/peak_drop"] = [max(rewards) - window_mean(hist, "reward/mean", "final")]
    return {"final": final, "growth": growth}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _blocks(vals: list[float], blocks: int) -> list[float]:
    """Means of `blocks` equal consecutive blocks of `vals` (the last len % blocks values
    left out); [] when there are fewer values than blocks."""
    size = len(vals) // blocks
    return [sum(vals[i * size:(i + 1) * size]) / size for i in range(blocks)] if size else []

"""Claims 1-2 of a one-seed run: consecutive blocks of its windows stand in for seeds.

Kept apart from report/curves.py, which the train stages read (dvc.yaml): a change here
rebuilds the report, not the study.
"""
from __future__ import annotations

import math

from margrpo.report.curves import SPARSE_PREFIXES, WINDOW, _numeric, window_mean

# Blocks per window. Five is the fewest that give a spread with some stability (4 degrees of
# freedom) while each block stays long (10 steps of a 200-step run's 50-step window), so that
# neighbouring blocks are closer to independent than neighbouring steps.
BLOCKS = 5


def block_stats(hist: list[dict], blocks: int = BLOCKS) -> dict[str, dict[str, list[float]]]:
    """curves.train_stats of one seed's run with `blocks` consecutive blocks of each window
    (the first and last WINDOW of its steps) as the replicates: 'final' the block means of
    the final window, 'growth' final block i − early block i, 'reward/peak_drop' the run's
    one value. Dense keys only.

    The growth pairs a final block with the early block at the same place in its window, as
    seeds pair a seed's own windows: a trend that both windows share cancels in the pairs, so
    their spread is that of the blocks around it. Steps are autocorrelated, so neighbouring
    blocks are too, and 2 se from blocks is a lower bound on the uncertainty. Nothing here
    measures the seed-to-seed spread."""
    rows = [_numeric(r) for r in hist]
    keys = sorted({k for r in rows for k in r if not k.startswith(SPARSE_PREFIXES)})
    final: dict[str, list[float]] = {}
    growth: dict[str, list[float]] = {}
    for k in keys:
        vals = [r[k] for r in rows if k in r]
        n = max(1, math.ceil(WINDOW * len(vals)))  # the window of curves.window_mean
        f, e = _blocks(vals[-n:], blocks, from_end=True), _blocks(vals[:n], blocks, from_end=False)
        if f:
            final[k] = f
        if f and len(e) == len(f):
            growth[k] = [a - b for a, b in zip(f, e)]
    if "reward/mean" in final:
        rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
        final["reward/peak_drop"] = [max(rewards) - window_mean(hist, "reward/mean", "final")]
    return {"final": final, "growth": growth}


def _blocks(vals: list[float], blocks: int, from_end: bool) -> list[float]:
    """Means of `blocks` equal consecutive blocks of `vals`; the len % blocks values left
    over are dropped at the start (from_end: the final window keeps the run's last steps)
    or at the end. [] when there are fewer values than blocks."""
    size = len(vals) // blocks
    if not size:
        return []
    vals = vals[len(vals) - size * blocks:] if from_end else vals[:size * blocks]
    return [sum(vals[i * size:(i + 1) * size]) / size for i in range(blocks)]

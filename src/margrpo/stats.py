"""Mean and spread of a handful of values (seeds, replicates): the one copy every report uses.

The sample variance uses ddof=1 (an unbiased estimate from n seeds); with a single value it
is undefined, so `mean_var` gives NaN and `mean_std` gives 0 (a table cell "0.412 ± 0.000"
rather than "nan" when a study runs one seed).
"""
from __future__ import annotations

import math
from typing import Sequence


def mean_var(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample variance with ddof=1 or NaN for one value, n); values non-empty."""
    n = len(values)
    if n == 0:
        raise ValueError("mean_var of no values")
    m = sum(values) / n
    var = sum((v - m) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
    return m, var, n


def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation with ddof=1 or 0.0 for one value, n)."""
    m, var, n = mean_var(values)
    return m, math.sqrt(var) if n > 1 else 0.0, n


def aggregate(runs: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """{'mean': {...}, 'std': {...}, 'n': {...}} per key over runs (replicates or seeds),
    skipping non-finite values; a key with no finite value is left out."""
    keys = sorted({k for r in runs for k in r})
    mean, std, n = {}, {}, {}
    for k in keys:
        vals = [r[k] for r in runs if k in r and math.isfinite(r[k])]
        if vals:
            mean[k], std[k], n[k] = mean_std(vals)
    return {"mean": mean, "std": std, "n": n}

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


def expected_max(values: Sequence[float], k: int) -> float:
    """E[max of k draws without replacement] from n samples of one prompt, without bias.

    The i-th smallest of the n values (1-based) is the maximum of C(i-1, k-1) of the C(n, k)
    k-subsets, so the mean over all subsets is sum_i C(i-1, k-1) x_(i) / C(n, k). On 0/1
    values it is pass@k, 1 - C(n-c, k) / C(n, k). k = 1 gives the mean.
    """
    n = len(values)
    if not 1 <= k <= n:
        raise ValueError(f"expected_max needs 1 <= k <= n, got k={k} with n={n} values")
    xs = sorted(values)
    total = math.comb(n, k)
    return sum(math.comb(i - 1, k - 1) * x for i, x in enumerate(xs, start=1) if i >= k) / total

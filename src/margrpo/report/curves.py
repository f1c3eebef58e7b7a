"""Training histories (the trainer's history.jsonl) -> per-step curves and window statistics."""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from margrpo.stats import mean_std

# Metrics the probe logs only on some steps: summarised over every step they appear on.
SPARSE_PREFIXES = ("probe/",)
# Fraction of the run used as the "final" (and "early") window.
WINDOW = 0.25


def read_history(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])


def _numeric(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def mean_curve(histories: list[list[dict]]) -> list[dict]:
    """Per-step mean over seeds of every numeric metric (steps missing in a seed skipped)."""
    by_step: dict[int, dict[str, list[float]]] = {}
    for hist in histories:
        for row in hist:
            acc = by_step.setdefault(int(row["step"]), {})
            for k, v in _numeric(row).items():
                acc.setdefault(k, []).append(v)
    return [{"step": s, **{k: sum(v) / len(v) for k, v in sorted(acc.items())}} for s, acc in sorted(by_step.items())]


def curve_csv(rows: list[dict]) -> str:
    """CSV text with a `step` column first and one column per metric (a DVC plot's input)."""
    fields = sorted({k for r in rows for k in r} - {"step"})
    out = io.StringIO()
    writer = csv.DictWriter(out, ["step", *fields])
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def window_mean(hist: list[dict], key: str, which: str = "final") -> float | None:
    """Mean of `key` over the first or last WINDOW of steps (all steps for sparse keys)."""
    vals = [(r["step"], r[key]) for r in hist if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not vals:
        return None
    if not key.startswith(SPARSE_PREFIXES):
        n = max(1, math.ceil(WINDOW * len(vals)))
        vals = vals[-n:] if which == "final" else vals[:n]
    return sum(v for _, v in vals) / len(vals)


# Metrics worth a column in `dvc metrics show` / `dvc exp show` (the full set is in MLflow).
HEADLINE_PREFIXES = ("reward/mean", "loss/", "diag/grad_norm", "diag/approx_kl", "select/", "probe/", "time/step")


def final_window(histories: dict[int, list[dict]]) -> dict:
    """{'final_window': {'mean': {metric: ..}, 'std': {..}}, 'seeds': n} over seeds."""
    keys = sorted({k for h in histories.values() for r in h for k in _numeric(r) if k.startswith(HEADLINE_PREFIXES)})
    mean, std = {}, {}
    for k in keys:
        per_seed = [v for h in histories.values() if (v := window_mean(h, k)) is not None]
        if per_seed:
            mean[k], std[k], _ = mean_std(per_seed)
    return {"final_window": {"mean": mean, "std": std}, "seeds": len(histories)}


def train_stats(histories: dict[int, list[dict]]) -> dict[str, dict[str, list[float]]]:
    """Per-seed 'final' window means, 'growth' (final − early window) and reward/peak_drop."""
    keys = sorted({k for h in histories.values() for r in h for k in r if k != "step"})
    final: dict[str, list[float]] = {}
    growth: dict[str, list[float]] = {}
    for h in histories.values():
        for k in keys:
            f, e = window_mean(h, k, "final"), window_mean(h, k, "early")
            if f is not None:
                final.setdefault(k, []).append(f)
            if f is not None and e is not None and not k.startswith("probe/"):
                growth.setdefault(k, []).append(f - e)
        rewards = [r["reward/mean"] for r in h if "reward/mean" in r]
        if rewards:
            final.setdefault("reward/peak_drop", []).append(max(rewards) - window_mean(h, "reward/mean", "final"))
    return {"final": final, "growth": growth}

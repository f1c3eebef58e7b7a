"""Training histories (the trainer's history.jsonl) -> curves, window statistics, figures."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

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


def write_curve_csv(rows: list[dict], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for r in rows for k in r} - {"step"})
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, ["step", *fields])
        writer.writeheader()
        writer.writerows(rows)


def read_curve_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: float(v) for k, v in row.items() if v not in ("", None)} for row in csv.DictReader(f)]


def window_mean(hist: list[dict], key: str, which: str = "final") -> float | None:
    """Mean of `key` over the first or last WINDOW of steps (all steps for sparse keys)."""
    vals = [(r["step"], r[key]) for r in hist if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not vals:
        return None
    if not key.startswith(SPARSE_PREFIXES):
        n = max(1, math.ceil(WINDOW * len(vals)))
        vals = vals[-n:] if which == "final" else vals[:n]
    return sum(v for _, v in vals) / len(vals)


def mean_std(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return m, sd, n


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


def plot_curves(curves: dict[str, dict[int, list[dict]]], keys: list[str], path: Path) -> Path | None:
    """One panel per metric key; one line per method (mean over seeds) with a band of
    +- 1 std over seeds. curves: method -> seed -> history rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if any(k in r for seeds in curves.values() for h in seeds.values() for r in h)]
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for method, seeds in curves.items():
            steps = sorted({r["step"] for h in seeds.values() for r in h if key in r})
            if not steps:
                continue
            stats = [mean_std([r[key] for h in seeds.values() for r in h if r["step"] == s and key in r]) for s in steps]
            m = [x[0] for x in stats]
            sd = [x[1] for x in stats]
            ax.plot(steps, m, label=method)
            ax.fill_between(steps, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

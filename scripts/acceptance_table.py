"""Benchmark table of issue 3: held-out GenEval-style overall, base vs every trained method.

    .venv/bin/python scripts/acceptance_table.py            # after `dvc repro`

Reads what the study wrote (nothing is recomputed): reports/eval/<target>/per_seed.json
(held-out scores of every seed, same prompts and image seeds for every target) and
reports/train/<method>/seeds/seed<s>/history.jsonl (the trainer's per-step time/step, in seconds).
Prints one row per target with the mean +- std over seeds, the gain over the base, the
training wall time per seed (sum of step times, probes and checkpoints excluded) and the
acceptance check: gain >= +0.10 within <= 10 minutes of training, at least 3 seeds.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from margrpo.config import load_params
from margrpo.report.build import train_record_dir
from margrpo.report.curves import mean_std

KEY = "eval/geneval/overall"
TARGET_GAIN, BUDGET_MIN, MIN_SEEDS = 0.10, 10.0, 3


def per_seed_scores(reports: Path, target: str) -> dict[str, float]:
    path = reports / "eval" / target / "per_seed.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `dvc repro` (or `dvc repro evaluate@{target}`) first")
    return {seed: row[KEY] for seed, row in json.loads(path.read_text()).items()}


def train_minutes(reports: Path, method: str, seed: str) -> tuple[float, float]:
    """(training minutes, median step seconds) of one seed from its history."""
    path = train_record_dir(reports, method, seed) / "history.jsonl"
    if not path.exists():
        return float("nan"), float("nan")
    steps = [json.loads(line)["time/step"] for line in path.read_text().splitlines() if line.strip()]
    return sum(steps) / 60.0, statistics.median(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=Path, default=Path("reports"))
    ap.add_argument("--methods", default=None, help="comma-separated (default: every method in --params)")
    ap.add_argument("--params", default="params.yaml")
    a = ap.parse_args()
    methods = a.methods.split(",") if a.methods else list(load_params(a.params).methods)
    base = per_seed_scores(a.reports, "base")
    base_mean, base_std, _ = mean_std(list(base.values()))
    print("| model | seeds | GenEval overall (held-out) | gain vs base | per seed | train min/seed | s/step | accept |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| base | {len(base)} | {base_mean:.3f} +- {base_std:.3f} | - | "
          f"{', '.join(f'{v:.3f}' for v in base.values())} | - | - | - |")
    for method in methods:
        scores = per_seed_scores(a.reports, method)
        m, s, _ = mean_std(list(scores.values()))
        times = [train_minutes(a.reports, method, seed) for seed in scores]
        minutes = max(t for t, _ in times)
        step_s = statistics.median(st for _, st in times)
        ok = m - base_mean >= TARGET_GAIN and minutes <= BUDGET_MIN and len(scores) >= MIN_SEEDS
        print(f"| {method} | {len(scores)} | {m:.3f} +- {s:.3f} | {m - base_mean:+.3f} | "
              f"{', '.join(f'{v:.3f}' for v in scores.values())} | {minutes:.1f} | {step_s:.2f} | "
              f"{'yes' if ok else 'no'} |")
    print(f"accept: gain >= +{TARGET_GAIN:.2f} with <= {BUDGET_MIN:.0f} min of training per seed and "
          f">= {MIN_SEEDS} seeds")


if __name__ == "__main__":
    main()

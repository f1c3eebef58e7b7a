"""The study's acceptance table (issue 17): does RL improve the base, per seed, in budget?

    .venv/bin/python scripts/acceptance_table.py            # after `dvc repro`

Reads what the study wrote (nothing is recomputed):
- reports/eval/<target>/per_seed.json: the GenEval-style overall on the TEST split of each
  seed's final model (base: one replicate per seed, the same prompts and image seeds);
  per_seed_best.json: the same for the best-by-held-out checkpoint (selected on the
  held-out split during training, scored here on the disjoint test split);
- reports/train/<method>/seeds/seed<s>/history.jsonl: training reward per step and the
  trainer's per-step seconds (time/step).

Prints, per method and checkpoint, the mean over seeds, the gain over the base with the
paired per-seed differences (seed s of the method minus base replicate s), the training
reward rise (mean of the last 10 steps minus the first 10, in standard errors) per seed,
raw and, for methods with paired_base, paired with the base model on the same batches
(report/learning.py rise_key: the acceptance reads the paired rise where it exists),
the steps each seed would need for that rise to reach 3 standard errors if its reward kept
its fitted trend and noise (report/learning.py `steps_to_detect`; inf: no upward trend),
the training minutes per seed, and the acceptance check: gain >= +0.05, every seed above
the base, the reward rising by >= 3 standard errors in every seed, <= 15 minutes of
training per seed.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from margrpo.config import load_params
from margrpo.jsonl import read_jsonl
from margrpo.report.build import train_record_dir
from margrpo.report.learning import PAIRED_KEY, RAW_KEY, reward_rise, rise_key, steps_to_detect
from margrpo.stats import mean_std

KEY = "eval/geneval/overall"
TARGET_GAIN, BUDGET_MIN, MIN_Z = 0.05, 15.0, 3.0


def per_seed_scores(reports: Path, target: str, which: str = "") -> dict[str, float]:
    path = reports / "eval" / target / f"per_seed{which}.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run `dvc repro` (or `dvc repro evaluate@{target}`) first")
    return {seed: row[KEY] for seed, row in json.loads(path.read_text()).items()}


def train_stats(reports: Path, method: str, seed: str) -> tuple[float, float, float, float | None, float]:
    """(training minutes, median step seconds, raw reward rise z, paired rise z (None without
    paired_base), steps for the tested z >= MIN_Z at the fitted trend) of one seed."""
    path = train_record_dir(reports, method, seed) / "history.jsonl"
    rows = read_jsonl(path)
    steps = [row["time/step"] for row in rows]
    key = rise_key(rows)
    return (sum(steps) / 60.0, statistics.median(steps), reward_rise(rows, key=RAW_KEY)["z"],
            reward_rise(rows, key=PAIRED_KEY)["z"] if key == PAIRED_KEY else None,
            steps_to_detect(rows, MIN_Z, key=key)["steps"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=Path, default=Path("reports"))
    ap.add_argument("--methods", default=None, help="comma-separated (default: every method in --params)")
    ap.add_argument("--params", default="params.yaml")
    a = ap.parse_args()
    methods = a.methods.split(",") if a.methods else list(load_params(a.params).methods)
    base = per_seed_scores(a.reports, "base")
    base_mean, base_std, _ = mean_std(list(base.values()))
    print("| model | checkpoint | test GenEval overall | gain vs base | paired per-seed gains | reward rise z (raw; paired) "
          "| steps for 3 se | train min/seed | s/step | accept |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| base | - | {base_mean:.3f} +- {base_std:.3f} | - | - | - | - | - | - | - |")
    for method in methods:
        stats = {seed: train_stats(a.reports, method, seed) for seed in base}
        minutes = max(s[0] for s in stats.values())
        step_s = statistics.median(s[1] for s in stats.values())
        raw_z = ", ".join(f"{s[2]:.1f}" for s in stats.values())
        paired = [s[3] for s in stats.values()]
        has_paired = all(z is not None for z in paired)
        zs = paired if has_paired else [s[2] for s in stats.values()]
        rise = raw_z + (f"; paired {', '.join(f'{z:.1f}' for z in paired)}" if has_paired else "")
        needed = ", ".join(str(s[4]) for s in stats.values())
        for label, which in (("final", ""), ("best", "_best")):
            scores = per_seed_scores(a.reports, method, which)
            m, s, _ = mean_std(list(scores.values()))
            gains = [scores[seed] - base[seed] for seed in base]
            ok = (m - base_mean >= TARGET_GAIN and all(g > 0 for g in gains) and all(z >= MIN_Z for z in zs)
                  and minutes <= BUDGET_MIN and len(gains) >= 3)
            print(f"| {method} | {label} | {m:.3f} +- {s:.3f} | {m - base_mean:+.3f} | "
                  f"{', '.join(f'{g:+.3f}' for g in gains)} | {rise} | {needed} | "
                  f"{minutes:.1f} | {step_s:.1f} | {'yes' if ok else 'no'} |")
    print(f"accept: gain >= +{TARGET_GAIN:.2f} on the test split, every seed above the base, training reward "
          f"rising >= {MIN_Z:.0f} standard errors in every seed (paired with the base where logged), "
          f"<= {BUDGET_MIN:.0f} min of training per seed")


if __name__ == "__main__":
    main()

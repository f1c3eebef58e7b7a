"""The study's acceptance table: does RL improve the base, per seed, in budget?

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

Where the evaluate stage wrote reports/eval/<target>/per_prompt.json, scores and gains are
the headline statistic with its t-interval over seeds (report/intervals.py;
the gain paired with the base by seed and prompt), and "every seed above the base" becomes
"the gain's 95% interval above 0".

Seeds are params.yaml's train.seeds. A method with no record for them (e.g. after
`dvc exp run -S 'train.seeds=[5,6,7]' evaluate@grpo`, which trains and evaluates grpo
alone) is listed with the command that makes one; the others are reported on the seeds
they have.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from margrpo.config import load_params
from margrpo.jsonl import read_jsonl
from margrpo.report.build import train_record_dir
from margrpo.report.intervals import read_per_prompt, score_interval
from margrpo.report.learning import PAIRED_KEY, RAW_KEY, reward_rise, rise_key, steps_to_detect
from margrpo.stats import mean_std

KEY = "eval/geneval/overall"
TARGET_GAIN, BUDGET_MIN, MIN_Z = 0.05, 15.0, 3.0


def per_seed_scores(reports: Path, target: str, which: str = "", seeds: list[str] | None = None) -> dict[str, float]:
    """seed -> test overall of per_seed{which}.json, restricted to `seeds`; {} when missing."""
    path = reports / "eval" / target / f"per_seed{which}.json"
    if not path.exists():
        return {}
    rows = json.loads(path.read_text())
    return {seed: row[KEY] for seed, row in rows.items() if KEY in row and (seeds is None or seed in seeds)}


def recorded_seeds(reports: Path, target: str, seeds: list[str]) -> list[str]:
    """The seeds of `seeds` with a test score and (methods) a training history."""
    scores = per_seed_scores(reports, target, seeds=seeds)
    return [s for s in seeds if s in scores
            and (target == "base" or (train_record_dir(reports, target, s) / "history.jsonl").exists())]


def train_stats(reports: Path, method: str, seed: str) -> tuple[float, float, float, float | None, float]:
    """(training minutes, median step seconds, raw reward rise z, paired rise z (None without
    paired_base), steps for the tested z >= MIN_Z at the fitted trend) of one seed."""
    path = train_record_dir(reports, method, seed) / "history.jsonl"
    rows = read_jsonl(path)
    steps = [row["time/step"] for row in rows]
    key = rise_key(rows)

    def z(k: str) -> float:  # nan for a run shorter than two 10-step windows
        try:
            return reward_rise(rows, key=k)["z"]
        except ValueError:
            return math.nan

    try:
        needed = steps_to_detect(rows, MIN_Z, key=key)["steps"]
    except ValueError:
        needed = math.nan
    return (sum(steps) / 60.0, statistics.median(steps), z(RAW_KEY), z(PAIRED_KEY) if key == PAIRED_KEY else None,
            needed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=Path, default=Path("reports"))
    ap.add_argument("--methods", default=None, help="comma-separated (default: every method in --params)")
    ap.add_argument("--params", default="params.yaml")
    a = ap.parse_args()
    params = load_params(a.params)
    methods = a.methods.split(",") if a.methods else list(params.methods)
    seeds = [str(s) for s in params.train.seeds]
    base = per_seed_scores(a.reports, "base", seeds=seeds)
    base_pp = read_per_prompt(a.reports, "base", seeds)
    print("| model | checkpoint | test GenEval overall | gain vs base | paired per-seed gains | reward rise z (raw; paired) "
          "| steps for 3 se | train min/seed | s/step | accept |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    if base:
        base_iv = score_interval(base_pp, KEY) if base_pp else None
        base_mean, base_std, _ = mean_std(list(base.values()))
        cell = base_iv.cell() if base_iv else f"{base_mean:.3f} +- {base_std:.3f}"
        print(f"| base | - | {cell} | - | - | - | - | - | - | - |")
    else:
        print(f"| base | - | no record for seeds {', '.join(seeds)}: `dvc repro evaluate_base` "
              "| - | - | - | - | - | - | - |")
    missing = []
    for method in methods:
        have = recorded_seeds(a.reports, method, seeds)
        if not have:
            missing.append(method)
            print(f"| {method} | - | no record for seeds {', '.join(seeds)}: "
                  f"`dvc repro train@{method} evaluate@{method}` | - | - | - | - | - | - | - |")
            continue
        pp = read_per_prompt(a.reports, method, have)
        stats = {seed: train_stats(a.reports, method, seed) for seed in have}
        minutes = max(s[0] for s in stats.values())
        step_s = statistics.median(s[1] for s in stats.values())
        raw_z = ", ".join(f"{s[2]:.1f}" for s in stats.values())
        paired = [s[3] for s in stats.values()]
        has_paired = all(z is not None for z in paired)
        zs = paired if has_paired else [s[2] for s in stats.values()]
        rise = raw_z + (f"; paired {', '.join(f'{z:.1f}' for z in paired)}" if has_paired else "")
        needed = ", ".join(str(s[4]) for s in stats.values())
        for label, which in (("final", ""), ("best", "_best")):
            scores = per_seed_scores(a.reports, method, which, have)
            if not scores:
                print(f"| {method} | {label} | no per_seed{which}.json record | - | - | {rise} | {needed} | "
                      f"{minutes:.1f} | {step_s:.1f} | no |")
                continue
            m, s, _ = mean_std(list(scores.values()))
            gains = [scores[seed] - base[seed] for seed in scores if seed in base]
            iv = score_interval(pp, KEY, label) if pp else None
            gain_iv = score_interval(pp, KEY, label, minus=base_pp) if pp and base_pp else None
            gain = gain_iv.point if gain_iv else mean_std(gains)[0] if gains else None
            above = gain_iv.low > 0 if gain_iv else bool(gains) and all(g > 0 for g in gains)
            ok = (gain is not None and gain >= TARGET_GAIN and above and all(z >= MIN_Z for z in zs)
                  and minutes <= BUDGET_MIN and len(gains) >= 3)
            score_cell = iv.cell() if iv else f"{m:.3f} +- {s:.3f}"
            gain_cell = (gain_iv.cell(signed=True) if gain_iv else f"{gain:+.3f}" if gain is not None
                         else f"no base replicate for seeds {', '.join(scores)}")
            print(f"| {method} | {label} | {score_cell} | {gain_cell} | "
                  f"{', '.join(f'{g:+.3f}' for g in gains) or '-'} | {rise} | {needed} | "
                  f"{minutes:.1f} | {step_s:.1f} | {'yes' if ok else 'no'} |")
    print(f"accept: gain >= +{TARGET_GAIN:.2f} on the test split, every seed above the base (where per_prompt.json "
          f"exists: scores and gains are mean [95% t-interval over seeds], and the gain's interval must lie "
          f"above 0), training reward rising >= {MIN_Z:.0f} standard errors in every seed (paired with the base where "
          f"logged), <= {BUDGET_MIN:.0f} min of training per seed, >= 3 seeds paired with the base")
    if missing:
        print(f"not reported (no record for seeds {', '.join(seeds)}): {', '.join(missing)}")


if __name__ == "__main__":
    main()

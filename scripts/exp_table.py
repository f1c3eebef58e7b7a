"""The DVC experiments of this repo as one readable table, and claim 4 across them.

    python scripts/exp_table.py            # workspace, commits and every experiment
    python scripts/exp_table.py --all      # also the experiments of older commits

`dvc exp show` prints every param and metric column and, with this study's ~150 columns,
a box of "…". This reads `dvc exp show --json` and prints what an ablation is compared on:
the knobs (k, tau, num_trajectories, train.steps, seeds; plus any other param that differs
between the rows) and the held-out GenEval overall of every target with the gain of each
method over the base (reports/summary.json). The same columns with DVC's own table:

    dvc exp show --drop '.*' --keep '^(Experiment|k|tau|num_trajectories|train\\.steps|overall\\..*|gain\\..*)$'

Claim 4 of method.md §6 (k = 0.3 is the best trade-off; tau = 0 is best) needs studies
that differ only in k or tau; when the experiments contain such a group, the script compares
mar_grpo's held-out overall at k = 0.3 (tau = 0) against every other value with the report's
rule (difference of seed means against 2 standard errors, from reports/eval/mar_grpo/metrics.json).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from margrpo.report.claims import FAILS, HOLDS, UNSURE, compare_stats

KNOBS = ("k", "tau", "num_trajectories", "train.steps", "train.seeds")
MTE_METRICS = "reports/eval/mar_grpo/metrics.json"


def flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): json.dumps(tree) if isinstance(tree, list) else tree}


def rows_of(show: list[dict]) -> list[dict]:
    """One row per workspace / commit / experiment: name, flat params, metrics files."""
    out = []
    for entry in show:
        rev = entry["rev"]
        items = [(entry.get("name") or (rev if rev == "workspace" else rev[:7]), entry["data"])]
        for exp in entry.get("experiments") or []:
            items += [(r.get("name") or r["rev"][:7], r["data"]) for r in exp["revs"]]
        for name, data in items:
            params = flat((data.get("params") or {}).get("params.yaml", {}).get("data", {}))
            metrics = {path: m.get("data", {}) for path, m in (data.get("metrics") or {}).items()}
            out.append({"name": name, "params": params, "metrics": metrics})
    return out


def table(rows: list[dict]) -> str:
    varying = sorted({k for r in rows for k in r["params"]
                      if len({json.dumps(x["params"].get(k)) for x in rows}) > 1} - set(KNOBS))
    targets = sorted({t for r in rows for t in r["metrics"].get("reports/summary.json", {}).get("overall", {})},
                     key=lambda t: (t != "base", t))
    header = ["experiment", *KNOBS, *varying, *[f"overall {t}" for t in targets],
              *[f"gain {t}" for t in targets if t != "base"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        summary = r["metrics"].get("reports/summary.json", {})
        cells = [r["name"], *[str(r["params"].get(k, "")) for k in (*KNOBS, *varying)]]
        cells += [_num(summary.get("overall", {}).get(t)) for t in targets]
        cells += [_num(summary.get("gain", {}).get(t), signed=True) for t in targets if t != "base"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(value, signed: bool = False) -> str:
    return "" if value is None else f"{value:+.3f}" if signed else f"{value:.3f}"


def claim4(rows: list[dict], knob: str, default: float) -> list[str]:
    """Verdict lines for `knob` = default against the other values in each group of rows
    whose params differ in nothing but `knob`."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        m = r["metrics"].get(MTE_METRICS)
        if not m or "mean" not in m:
            continue
        rest = {k: v for k, v in r["params"].items() if k != knob}
        groups.setdefault(json.dumps(rest, sort_keys=True), []).append(r)
    lines = []
    for members in groups.values():
        by_value = {r["params"].get(knob): r for r in members}
        if default not in by_value or len(by_value) < 2:
            continue
        ref = by_value[default]["metrics"][MTE_METRICS]
        parts = []
        for value, r in sorted(by_value.items()):
            if value == default:
                continue
            m = r["metrics"][MTE_METRICS]
            parts.append(compare_stats(
                f"{knob}={default} − {knob}={value} ({r['name']})",
                (ref["mean"]["eval/geneval/overall"], ref["std"]["eval/geneval/overall"], ref["replicates"]),
                (m["mean"]["eval/geneval/overall"], m["std"]["eval/geneval/overall"], m["replicates"])))
        statuses = {p.status for p in parts}
        verdict = FAILS if FAILS in statuses else HOLDS if statuses == {HOLDS} else UNSURE
        lines.append(f"claim 4, {knob} = {default} best (mar_grpo held-out overall, "
                     f"{by_value[default]['name']}): {verdict}")
        lines += [f"  {p.render()}" for p in parts]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true", help="experiments of every commit (dvc exp show -A)")
    args = ap.parse_args()
    cmd = ["dvc", "exp", "show", "--json"] + (["-A"] if args.all else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr.strip() or f"{' '.join(cmd)} failed")
    rows = rows_of(json.loads(proc.stdout))
    print(table(rows))
    centre = yaml.safe_load(Path("params.yaml").read_text())  # the study's knobs: claim 4's centre
    verdicts = claim4(rows, "k", centre["k"]) + claim4(rows, "tau", centre["tau"])
    print("\n" + ("\n".join(verdicts) if verdicts else
                  "claim 4: no experiments that differ only in k or tau (e.g. dvc exp run --temp -S k=0.5)"))


if __name__ == "__main__":
    main()

"""Seeds the decisive comparisons need, from the committed per-prompt scores.

    python probes/power.py                    # reports/eval/*/per_prompt.json, params.yaml's methods
    python probes/power.py --delta 0.03 --power 0.8

The table of docs/ablation.md (seeds by design); the design and its formulas are
margrpo/probes/power.py's docstring.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import yaml

from margrpo.probes.power import DECISIVE, UPPER, rows
from margrpo.report.ablation import roles
from margrpo.report.claims import DELTA
from margrpo.report.intervals import read_per_prompt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reports", type=Path, default=Path("reports"))
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--delta", type=float, default=DELTA, help="the difference to resolve (the claims' δ)")
    ap.add_argument("--power", type=float, default=0.8, help="probability of detecting a true difference of δ")
    a = ap.parse_args(argv)
    raw = yaml.safe_load(a.params.read_text())
    names = {role: m for role, m in roles(raw).items() if role in DECISIVE}
    seeds = raw["train"]["seeds"]
    table, decisive = rows(a.reports, names, seeds, a.delta, a.power)
    absent = [r for r in DECISIVE if r not in names or read_per_prompt(a.reports, names[r], seeds) is None]
    print(f"Paired design, GenEval overall (test split, final checkpoints), δ = {a.delta}; formulas in "
          f"margrpo/probes/power.py's docstring. Seeds measured: {seeds}.")
    print("| comparison | d [95%] | seeds | var_seed paired | var_seed unpaired | var_prompt | seeds: decisive "
          f"(var_seed / its {UPPER:.0%} upper bound) | seeds: {a.power:.0%} power (same) | report's estimate |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    if absent:
        print(f"not measured (no method or no reports/eval/<method>/per_prompt.json): {', '.join(absent)}")
    finite = [n for n in decisive if n is not None and math.isfinite(n)]
    if finite:
        print(f"The decisive comparisons resolve ±{a.delta} by the claims rule with {int(max(finite))} seeds (the "
              "largest above; at the measured seed variance): train.seeds of that length for the claims experiment.")
    if any(n is not None and math.isinf(n) for n in decisive):
        print("At least one comparison cannot reach the target with more seeds alone: its prompt part is wider than "
              "δ/2; more test prompts (world.test_prompts_per_tag) or images per prompt narrow it.")
    if not table:
        sys.exit("power: no pair of decisive methods has per-prompt scores (run the study: dvc repro)")


if __name__ == "__main__":
    main()

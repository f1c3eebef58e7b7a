"""Print the seeds each claim of study_design.yaml needs for its power, and each part's.

    .venv/bin/python scripts/design_seeds.py             # claims and parts at params.yaml's seeds
    .venv/bin/python scripts/design_seeds.py --seeds 12  # power at another number of seeds

The seeds come from the pilot's variance components and the smallest effects of interest
written in study_design.yaml (report/design.py), never from a run's measured differences.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from margrpo.config import load_params
from margrpo.report import design as study_design
from margrpo.report.inference import MAX_SEEDS, seeds_for_power

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", type=Path, default=ROOT / study_design.DESIGN_FILE, help="the design file")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per method to state the power at "
                                                            "(default: params.yaml train.seeds)")
    args = ap.parse_args()
    d = study_design.read(args.design)
    seeds = args.seeds or len(load_params(ROOT / "params.yaml").train.seeds)
    print(f"{args.design.name}: one-sided alpha {d.alpha}, target power {d.power:.0%}, "
          f"evaluation at {d.eval_scale:g}x the pilot's; power stated at {seeds} seeds per method")
    print(f"{'claim':>5}  {'part':<24} {'delta':>7} {'effect':>7} {'sd':>7} {'power':>6} {'seeds':>6}")
    for c in d.claims.values():
        for p in c.parts.values():
            need = seeds_for_power(p.effect, p.sd, d.power, p.design)
            print(f"{c.number:>5}  {p.key:<24} {p.delta:>7g} {p.effect:>7g} {p.sd:>7.4f} {float(p.power(seeds)):>6.0%} "
                  f"{need if need is not None else f'>{MAX_SEEDS}':>6}")
        need = c.seeds(d.power)
        print(f"{c.number:>5}  {'= claim (every part holds)':<24} {'':>7} {'':>7} {'':>7} {c.power(seeds):>6.0%} "
              f"{need if need is not None else f'>{MAX_SEEDS}':>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

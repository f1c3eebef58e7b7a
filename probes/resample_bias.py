"""Measure the bias of `resample`'s selected-token term on the base model's real tokens.

    .venv/bin/python probes/resample_bias.py [--params params.yaml] [--images 64] [--draws 16] [--seed 0]

The numbers of docs/method.md (why `mar_grpo` draws its estimate's chains independently);
the measurement is margrpo/probes/resample_bias.py (whose docstring describes it).
"""
from __future__ import annotations

import argparse

import torch

from margrpo.config import load_params, parse_overrides
from margrpo.models.loading import load_model
from margrpo.probes.resample_bias import SETS, measure, training_prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--draws", type=int, default=16, help="independent draws of every token's M chains")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("-S", dest="sets", action="append", default=[], help="dotted key=value override")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    params = load_params(a.params, parse_overrides(a.sets) | {"runtime.device": "cpu"})
    policy = load_model(params.model.checkpoint, params)
    res = measure(policy, params, *training_prompts(params, a.images, a.seed), a.draws)
    print(f"base {params.model.checkpoint}: {a.images} images x {a.draws} draws of M = {res['m']} chains per "
          f"committed token; top k = {res['k']} per image; score at head steps {res['head_steps'][0]}.."
          f"{res['head_steps'][-1]}, d/d(z_cond, z_null), cfg_mode {params.train.cfg_mode}")
    print("ratio = |mean score|^2 / (sum |s|^2 / n^2): about 1 for a zero-mean term; "
          "sqrt(ratio) = standard errors from 0")
    print(f"| AR step | {' | '.join(f'{n}: tokens, draws, ratio' for n in SETS)} | cos(sel, unsel) (tokens) | "
          "uncertainty sel / unsel |")
    print("|---" * (len(SETS) + 3) + "|")
    for key, row in res["rows"].items():
        cells = " | ".join(f"{row[n]['tokens']}, {row[n]['draws']:.0f}, {row[n]['ratio']:.2f}" for n in SETS)
        print(f"| {key} | {cells} | {row['cos']:+.2f} ({row['both']}) | "
              f"{row['selected']['unc']:.4f} / {row['unselected']['unc']:.4f} |")
    sel = res["rows"]["all"]["selected"]["ratio"]
    print(f"selected tokens, reused chains: squared mean score {sel:.1f}x that of a zero-mean term "
          f"(independent chains: {res['rows']['all'][SETS[2]]['ratio']:.1f}x)")


if __name__ == "__main__":
    main()

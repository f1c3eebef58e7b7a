"""The evaluation judge against the adversarial set: for every constructed image, the verdict
GenEval's rules give its true scene, the judge's verdict and the training reward's
(its GenEval half and the reward itself). The judge must agree with the truth on every case;
the reward may not, and where it does not is what the judge is for. Also times the judge.

    .venv/bin/python benchmarks/judge.py [--grid docs/img/adversarial.png]
"""
from __future__ import annotations

import argparse
import time

import torch

from margrpo.world.adversarial import SIZE, cases
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.generate import image_grid
from margrpo.world.grammar import parse_prompt
from margrpo.world.judge import WorldJudge


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=None, help="also write the images with their verdicts to this PNG")
    args = ap.parse_args()
    set_ = cases()
    images = torch.stack([c.image() for c in set_])
    metas = [parse_prompt(c.prompt) for c in set_]
    judge = WorldEvaluator(SIZE, detector=WorldJudge(SIZE))
    proxy = WorldEvaluator(SIZE)
    t0 = time.perf_counter()
    j = judge.score(images, metas)
    t_judge = time.perf_counter() - t0
    p = proxy.score(images, metas)
    agree_j = agree_p = 0
    print(f"{'case':32s} {'probes':18s} {'prompt':38s} truth judge reward(correct, value)")
    for i, c in enumerate(set_):
        truth = c.verdict()
        jv, pv = bool(j["correct"][i]), bool(p["correct"][i])
        agree_j += jv == truth
        agree_p += pv == truth
        flag = "" if jv == truth else "  <-- judge wrong"
        print(f"{c.name:32s} {c.kind:18s} {c.prompt:38s} {int(truth):5d} {int(jv):5d} "
              f"{int(pv):7d} {float(p['aligned'][i]):6.2f}{'' if pv == truth else ' *'}{flag}")
    n = len(set_)
    print(f"\n{n} cases: judge agrees with the truth on {agree_j}, the training reward's GenEval half on {agree_p} "
          f"(* = reward wrong); judge {1000 * t_judge / n:.2f} ms per image")
    if args.grid:
        labels = [f"{c.name}: truth {int(c.verdict())} judge {int(j['correct'][i])} reward {int(p['correct'][i])}"
                  for i, c in enumerate(set_)]
        image_grid(images[:, None], labels, scale=4, label_width=420).save(args.grid)
        print("wrote", args.grid)


if __name__ == "__main__":
    main()

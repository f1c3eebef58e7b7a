"""The evaluation judge against the adversarial set: for every constructed image, the verdict
GenEval's rules give its true scene, the judge's verdict and the training reward's
(its GenEval half and the reward itself). The judge must agree with the truth on every case;
the reward may not, and where it does not is what the judge is for. Also times the judge.

    .venv/bin/python benchmarks/judge.py [--grid docs/img/adversarial.png]
    .venv/bin/python benchmarks/judge.py --families [--seed 0 1 2] [--grid families.png]

--families: the near-miss families of world/families.py instead (>= 300 scenes, each with the
true verdict of an independent rule): per family, the false-accept rate (judged correct
where the truth fails) and the false-reject rate (judged wrong where it passes) of the
judge and of the training reward's GenEval half; ambiguous scenes are left out.
"""
from __future__ import annotations

import argparse
import time

import torch

from margrpo.world.adversarial import SIZE, cases
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.families import BANDS, family_cases, family_rates
from margrpo.world.generate import image_grid
from margrpo.world.grammar import parse_prompt
from margrpo.world.judge import WorldJudge


def families(seeds: list[int], grid: str | None) -> None:
    set_ = [c for seed in seeds for c in family_cases(seed)]
    images = torch.stack([c.image() for c in set_])
    metas = [parse_prompt(c.prompt) for c in set_]
    t0 = time.perf_counter()
    j = WorldEvaluator(SIZE, detector=WorldJudge(SIZE)).score(images, metas)["correct"].tolist()
    t_judge = time.perf_counter() - t0
    p = WorldEvaluator(SIZE).score(images, metas)["correct"].tolist()
    rj, rp = family_rates(set_, j), family_rates(set_, p)

    def cell(n: int, k: int) -> str:
        return f"{k}/{n} ({100 * k / n:.1f}%)" if n else "–"

    print(f"{len(set_)} scenes (seeds {', '.join(map(str, seeds))}); rates over the scenes whose truth is not "
          "ambiguous; judge {:.2f} ms per image\n".format(1000 * t_judge / len(set_)))
    print("| family | parameter | judge: false accepts | judge: false rejects | reward: false accepts | "
          "reward: false rejects | ambiguous |")
    print("|---|---|---|---|---|---|---|")
    for f, (param, *_rest) in BANDS.items():
        a, b = rj[f], rp[f]
        print(f"| {f} | {param} | {cell(a['fails'], a['false_accepts'])} | {cell(a['passes'], a['false_rejects'])} | "
              f"{cell(b['fails'], b['false_accepts'])} | {cell(b['passes'], b['false_rejects'])} | {a['ambiguous']} |")
    if grid:
        labels = [f"{c.family} {c.value:g}: truth {c.truth} judge {int(j[i])} reward {int(p[i])}"
                  for i, c in enumerate(set_)]
        image_grid(images[:, None], labels, scale=4, label_width=420).save(grid)
        print("wrote", grid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=None, help="also write the images with their verdicts to this PNG")
    ap.add_argument("--families", action="store_true", help="the near-miss families (world/families.py)")
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="with --families: the scenes' seeds (pooled)")
    args = ap.parse_args()
    if args.families:
        families(args.seed, args.grid)
        return
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

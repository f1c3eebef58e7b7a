"""Learning levers measured against the exact gradient: per-batch cosine of the trainer's
policy-gradient estimate with the pathwise gradient of the same expected reward.

    .venv/bin/python probes/lever_cosine.py --batches 8 --exact-images 512 \
        --variant "all-step:" --variant "window2:train.sde_window=2"

The reward is the dense, differentiable colour share (`world_colour`, world/colour_reward.py)
at temperature 0.1, unless -S rewards=... says otherwise (it must then be differentiable in
the pixels): at the reward's default 0.01 the pixels' soft palette assignment is so sharp
that the pathwise gradient of 256 images and of 256 others point apart (cosine -0.04). The
exact gradient of the mean reward over the transformer's weights (the frozen-head methods'
trained weights) comes from margrpo.probes.pathwise on --exact-images images of the train
prompts (their own seeds, every head transition stochastic: the sampler the evaluation uses),
from two halves whose cosine says how exact the reference is. Then per variant (name:
key=value,..., on top of the -S overrides), --batches training batches are collected with
the study's trainer and the loss gradient of each (negated: the loss points downhill) is
compared with it: the mean per-batch cosine (with its standard error over batches), the
cosine of the batches' sum (what that many steps' updates add up to, before Adam), and the
seconds per batch (collect + backward). A variant whose estimate aligns better per batch
needs proportionally fewer steps for the same progress. Prints a markdown table and one
JSON line per variant.

On the committed base at guidance 3 the pathwise gradient is heavy-tailed: of 32 images, the
3 largest per-image gradients carry 76% of the squared norm of their sum, and two halves of
1024 images point apart (cosine -0.04), so the probe warns that the reference is noise
(docs/learning.md has the measurement and what the levers were ranked by instead).
"""
from __future__ import annotations

import json
import math
import time

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.probes.pathwise import pathwise_gradient
from margrpo.training.gradprobe import flat_grad
from margrpo.training.trainer import Trainer

DENSE = "rewards=[{name: world_colour, temperature: 0.1}]"


def main() -> None:
    ap = script_parser(__doc__, overrides_help="dotted key=value (all variants)")
    ap.add_argument("--method", default="grpo_frozen")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--exact-images", type=int, default=512)
    ap.add_argument("--variant", action="append", required=True, help="name:key=value,key=value")
    a = ap.parse_args()
    prompts = read_jsonl("prompts/world_train.jsonl")

    base = params_from_args(a, before=[DENSE])
    ref = Trainer.from_params(base, a.method, a.seed, prompts)
    g = torch.Generator().manual_seed(10_000 + a.seed)
    pick = torch.randint(len(prompts), (a.exact_images,), generator=g).tolist()
    seeds = torch.randint(0, 2**62, (a.exact_images,), generator=g)
    t0 = time.time()
    ref.policy.eval()
    exact, self_cos = pathwise_gradient(ref.policy, ref.ar_params, ref.reward, [prompts[i] for i in pick], seeds)
    print(f"exact gradient: {a.exact_images} images, {time.time() - t0:.0f} s; cosine of its two halves "
          f"{float(self_cos):.3f}", flush=True)
    if self_cos < 0.3:
        # The reference agrees with itself so little that a variant's cosine with it measures
        # the reference's noise: more images, a smoother reward or a lower guidance scale.
        print(f"warning: the reference's two halves point nearly apart (cosine {float(self_cos):.3f} < 0.3); "
              "the cosines below cannot rank the variants (docs/learning.md)", flush=True)

    print("| variant | per-batch cosine | se | cosine of the sum | s per batch |")
    print("|---|---|---|---|---|")
    rows = []
    for v in a.variant:
        name, _, rest = v.partition(":")
        params = params_from_args(a, before=[DENSE], after=[x for x in rest.split(",") if x])
        tr = Trainer.from_params(params, a.method, a.seed, prompts)
        total, cos, secs = torch.zeros_like(exact), [], []
        for _ in range(a.batches):
            t = time.time()
            batch = tr.collect()
            tr.compute_grads(batch)
            secs.append(time.time() - t)
            est = -flat_grad([p.grad for p in tr.ar_params], tr.ar_params)
            cos.append(float(torch.nn.functional.cosine_similarity(est, exact, dim=0)))
            total += est
        mean = sum(cos) / len(cos)
        se = (sum((c - mean) ** 2 for c in cos) / max(1, len(cos) - 1) / len(cos)) ** 0.5
        summed = float(torch.nn.functional.cosine_similarity(total, exact, dim=0))
        row = {"variant": name, "overrides": rest, "cos": mean, "se": se, "cos_sum": summed,
               "s_per_batch": sorted(secs)[len(secs) // 2], "batches": a.batches,
               "exact_images": a.exact_images, "exact_self_cos": float(self_cos)}
        rows.append(row)
        print(f"| {name} | {mean:+.3f} | {se:.3f} | {summed:+.3f} | {row['s_per_batch']:.1f} |", flush=True)
    for row in rows:
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v)
                          for k, v in row.items()}))


if __name__ == "__main__":
    main()

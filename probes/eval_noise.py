"""Evaluation noise of one model: its test GenEval scores under several evaluation seeds.

The evaluate stages score each trained seed once; the spread of one fixed model's scores over
fresh per-image seeds (sigma_E) is the part of that spread the evaluation itself adds. This
probe samples the committed test prompts `--replicates` times with the image allocation of
params.yaml's evaluate section (or `--images-per-tag`), scores them with the judge, and
prints every replicate's GenEval overall and tag scores, sigma_E (sd over replicates) and the
seconds per image, then one JSON line.

    .venv/bin/python probes/eval_noise.py --replicates 5 [--model models/base] [--images-per-tag 320]
"""
from __future__ import annotations

import argparse
import json
import math
import time

from margrpo.config import load_params
from margrpo.jsonl import read_jsonl
from margrpo.models.loading import load_model
from margrpo.stats import mean_std
from margrpo.study import sample_and_score
from margrpo.world.generate import expand_prompts, image_seeds, summarize
from margrpo.world.grammar import GENEVAL_TAGS
from margrpo.world.judge import JudgedEvaluator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicates", type=int, default=5, help="evaluation seeds (replicate indices 0..n-1)")
    ap.add_argument("--model", default=None, help="model folder (default: params.yaml model.checkpoint)")
    ap.add_argument("--images-per-tag", type=int, default=None, help="override evaluate.images_per_tag")
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()

    params = load_params(args.params)
    e = params.evaluate
    per_tag = e.images_per_tag if args.images_per_tag is None else args.images_per_tag
    metas = read_jsonl("prompts/world_test.jsonl")
    k = e.images_per_prompt
    rows, _ = expand_prompts(metas, k, per_tag)
    model = load_model(args.model or params.model.checkpoint, params)
    judge = JudgedEvaluator(params.world.image_size)
    keys = ["eval/geneval/overall"] + [f"eval/geneval/{t}" for t in GENEVAL_TAGS]
    runs, t0 = [], time.time()
    for r in range(args.replicates):
        scores, _ = sample_and_score(model, rows, image_seeds(e.seed, r, len(rows), k), e.batch_size, judge,
                                     progress=True, desc=f"replicate {r}")
        s = summarize(scores)
        runs.append({key: s[key] for key in keys if key in s})
        print(f"replicate {r}: " + "  ".join(f"{key.split('/')[-1]} {v:.3f}" for key, v in runs[-1].items()), flush=True)
    seconds = time.time() - t0
    images = len(rows) * k * args.replicates
    out = {"replicates": args.replicates, "images_per_replicate": len(rows) * k, "images_per_tag": per_tag,
           "s_per_image": seconds / images}
    for key in keys:
        vals = [run[key] for run in runs if key in run]
        if vals:
            m, sd, n = mean_std(vals)
            out[key] = {"mean": m, "sigma_E": sd, "se_of_mean": sd / math.sqrt(n)}
    o = out["eval/geneval/overall"]
    print(f"GenEval overall {o['mean']:.3f}, sigma_E {o['sigma_E']:.4f} over {args.replicates} evaluation seeds "
          f"({out['images_per_replicate']} images each, {out['s_per_image'] * 1000:.1f} ms per image)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()

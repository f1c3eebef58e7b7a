"""Does what one reward taught show in another? Each model samples the same training batches
(prompts and image seeds from the trainer's own generators at --seed, so every model draws
the same prompts with the same noise), and every image is scored by the study's world reward
(its aligned score, its GenEval-correct and partial halves) and by the dense colour share of
ladder rung a (`world_colour`). Used in docs/learning.md to ask whether rung a's colour
training moved the world reward, and rung b's world training the colour share.

    .venv/bin/python probes/reward_transfer.py --models models/base \
        outputs/ladder/a/all-step/grpo_frozen_s0/final outputs/ladder/b/all-step/grpo_frozen_s0/final \
        [--batches 2] [--seed 7]

Prints one table row per model: the means over batches x 128 images, with the standard error
of the mean over the images' prompts (the unit the batches draw); then each later model's
paired difference from the first (same prompts, same noise), with its standard error.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.rewards.base import build_reward
from margrpo.stats import mean_var
from margrpo.training.trainer import Trainer

KEYS = ("aligned", "geneval_correct", "partial", "colour_share")


class _Both:
    """The world reward as the trainer's reward, recording the colour share of the same images."""

    def __init__(self, params):
        spec = next(s for s in params.reward_specs() if s["name"] == "world")
        self.world = build_reward("world", **{k: v for k, v in spec.items() if k not in ("name", "weight")})
        self.colour = build_reward("world_colour")
        self.rows: list[dict] = []

    def __call__(self, images, prompts, metas):
        aligned = self.world(images, prompts, metas)
        s = self.world.last_scores
        colour = self.colour(images, prompts, metas)
        for i, m in enumerate(metas):
            self.rows.append({"prompt": m["prompt"], "aligned": float(aligned[i]),
                              "geneval_correct": float(s["correct"][i]), "partial": float(s["partial"][i]),
                              "colour_share": float(colour[i])})
        return aligned


def mean_se(rows: list[dict], key: str) -> tuple[float, float]:
    """Mean over images, and its standard error with the prompt as the sampling unit."""
    by_prompt = defaultdict(list)
    for r in rows:
        by_prompt[r["prompt"]].append(r[key])
    _, var, n = mean_var([sum(v) / len(v) for v in by_prompt.values()])
    return sum(r[key] for r in rows) / len(rows), math.sqrt(var / n)


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--models", nargs="+", required=True, help="model folders (models/base, a run's final/)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7, help="the trainer seed whose batches every model draws")
    a = ap.parse_args()
    params = params_from_args(a)
    prompts = read_jsonl("prompts/world_train.jsonl")
    print("| model | " + " | ".join(KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    runs = []
    for path in a.models:
        reward = _Both(params)
        tr = Trainer.from_params(params, "grpo_frozen", a.seed, prompts, reward=reward, checkpoint=path)
        with torch.no_grad():
            for _ in range(a.batches):
                tr.collect()
        cells = [f"{m:.3f} ± {se:.3f}" for m, se in (mean_se(reward.rows, k) for k in KEYS)]
        print(f"| {path} | " + " | ".join(cells) + " |", flush=True)
        runs.append((path, reward.rows))
    (first, base), *later = runs
    for path, rows in later:
        assert [r["prompt"] for r in rows] == [r["prompt"] for r in base], "models drew different prompts"
        diff = [{"prompt": r["prompt"], **{k: r[k] - b[k] for k in KEYS}} for r, b in zip(rows, base)]
        cells = [f"{m:+.3f} ± {se:.3f}" for m, se in (mean_se(diff, k) for k in KEYS)]
        print(f"| {path} - {first} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

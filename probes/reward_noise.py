"""Step-to-step noise of the paired training reward of a fixed policy, by images per step.

    .venv/bin/python probes/reward_noise.py --policy outputs/probes/cos256_s0/final \
        --batches 32 --seed 0

The training-reward test (report/learning.py reward_rise) compares 10-step windows of
reward/vs_base, the policy's mean reward minus the base model's on the same prompts and
image seeds. Its standard error is sd x sqrt(2 / 10), where sd is the step-to-step spread.
Part of that spread is the policy moving between steps; the rest is which prompts and
image seeds a step drew. This script holds the policy fixed (no update) and draws
--batches batches of --prompts x group_size images from a trainer's own generators, as
training would: their spread is the sampling part alone. Pooling k consecutive batches is
a batch of k times the images (up to the trainer's stratified prompt draw, which can only
lower the spread), so the table gives the sampling spread, and the window standard error,
at each batch size; a training run's step-to-step spread above it is the policy's motion.
"""
from __future__ import annotations

import math
import statistics as st

import torch
from tqdm import tqdm

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.models.loading import load_model
from margrpo.training.stepstats import batch_metrics
from margrpo.training.trainer import Trainer


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--policy", required=True, help="a saved policy folder (a run's final/ or best/)")
    ap.add_argument("--method", default="grpo_frozen")
    ap.add_argument("--seed", type=int, default=0, help="the trainer's generators (prompts, image seeds)")
    ap.add_argument("--batches", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per batch (x train.group_size images)")
    a = ap.parse_args()

    params = params_from_args(a, fixed={
        f"methods.{a.method}.paired_base": True, "train.prompts_per_step": a.prompts,
        f"methods.{a.method}.batch_factor": 1})
    tr = Trainer.from_params(params, a.method, a.seed, read_jsonl("prompts/world_train.jsonl"), checkpoint=a.policy)
    tr.ref = load_model(params.model.checkpoint, params).eval()  # the base, not a copy of the policy
    gains = []
    with torch.no_grad():
        for _ in tqdm(range(a.batches), desc="batches", leave=False):
            b = tr.collect()
            gains.append(batch_metrics(b)["reward/vs_base"])
    n0 = a.prompts * params.train.group_size
    print(f"policy {a.policy}; {a.batches} batches of {n0} images; mean gain over all {a.batches * n0} images "
          f"{st.mean(gains):+.4f}")
    print("| images per step | steps | sd of the step's paired gain | sd(first row) / sqrt(k) | "
          "10-step window-difference se |")
    print("|---|---|---|---|---|")
    sd1 = st.stdev(gains)
    for f in (1, 2, 4, 8, 16):
        steps = [st.mean(gains[i:i + f]) for i in range(0, len(gains) - f + 1, f)]
        if len(steps) < 3:
            break
        sd = st.stdev(steps)
        print(f"| {n0 * f} | {len(steps)} | {sd:.4f} | {sd1 / math.sqrt(f):.4f} | {sd * math.sqrt(2 / 10):.4f} |")


if __name__ == "__main__":
    main()

"""Benchmark: MAR-GRPO step time / vanilla GRPO step time, side by side in one process.

    .venv/bin/python scripts/bench_step_time.py [--params params.yaml] [--steps 6] [--methods grpo,mar_grpo]

Each method after the first is compared with the first (any method of params.yaml).

Both trainers start from the same base model and alternate steps (so machine load hits
both alike); each step is rollout + reward + selection/estimator draws + loss + update.
Target (issue): ratio <= 1.3 at num_trajectories=4, k=0.3.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from margrpo.config import load_params
from margrpo.models.loading import load_model
from margrpo.rewards.base import build_weighted_reward
from margrpo.rl.trainer import Trainer
from margrpo.world.prompts import make_prompt_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--methods", default="grpo,mar_grpo")
    a = ap.parse_args()
    params = load_params(a.params)
    prompts = make_prompt_set("train", params.world.train_prompts_per_tag, params.world.seed)
    reward = build_weighted_reward(params.reward_specs())
    names = a.methods.split(",")
    trainers = {
        n: Trainer(load_model(params.model.checkpoint, params), params, params.method(n), 0, prompts, reward)
        for n in names
    }
    t = params.train
    print(f"batch: {t.prompts_per_step} prompts x {t.group_size} images; loss on {t.loss_ar_steps} AR steps x "
          f"{t.loss_head_steps} head steps; M={params.num_trajectories}, k={params.k}, tau={params.tau}")
    times: dict[str, list[float]] = {n: [] for n in names}
    parts: dict[str, list[float]] = {n: [] for n in names}
    for s in range(a.steps + 1):
        for n, tr in trainers.items():
            t0 = time.perf_counter()
            m = tr.train_step()
            if s > 0:  # step 0 is warm-up
                times[n].append(time.perf_counter() - t0)
                parts[n].append(m["time/rollout"])
    for n in names:
        print(f"{n:>10}: step {statistics.median(times[n]):.2f} s (rollout {statistics.median(parts[n]):.2f} s)")
    for n in names[1:]:
        r = statistics.median(times[n]) / statistics.median(times[names[0]])
        print(f"ratio {n}/{names[0]}: {r:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()

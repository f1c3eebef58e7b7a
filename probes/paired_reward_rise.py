"""The training-reward rise test, raw and paired with the base model on the same batches.

    .venv/bin/python probes/paired_reward_rise.py --method grpo_frozen
    .venv/bin/python probes/paired_reward_rise.py --method grpo_frozen \
        --runs 'outputs/probes/frozen60_s{seed}'

The training-reward rise test compares the mean training reward of the last 10 steps with the first 10
(report/learning.py reward_rise). Most of a step's noise is which prompts it drew. The
trainer draws each step's prompts and image seeds from its own generators ("data",
"rollout"), so a fresh trainer on the base model, calling `collect` once per step without
training, replays every step's exact prompts and image seeds, and the base's reward on
them is a control variate: the rise of (run reward - base reward) estimates the same rise
with the prompt-draw noise removed. Step 1 is a check: the run had not been updated yet,
so its reward must equal the base's.

Prints, per seed: raw z, paired z, and the rise / standard error of each.
"""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.report.learning import reward_rise
from margrpo.training.trainer import Trainer


def base_rewards(params, method: str, seed: int, steps: int) -> list[float]:
    """The base model's mean reward on each of the run's first `steps` batches."""
    tr = Trainer.from_params(params, method, seed, read_jsonl("prompts/world_train.jsonl"))
    out = []
    with torch.no_grad():
        for _ in tqdm(range(steps), desc=f"base replay seed {seed}", leave=False):
            out.append(tr.collect().rewards.mean().item())
    return out


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--method", default="grpo_frozen")
    ap.add_argument("--runs", default=None,
                    help="folder of a seed's history.jsonl, with {seed} (default: the study's reports/train/<method>/seeds/seed{seed})")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: params train.seeds")
    ap.add_argument("--window", type=int, default=10)
    a = ap.parse_args()

    params = params_from_args(a)
    runs = a.runs or f"reports/train/{a.method}/seeds/seed{{seed}}"
    print("| seed | steps | raw z (rise, se) | paired z (rise, se) | step-1 run - base |")
    print("|---|---|---|---|---|")
    for seed in a.seeds if a.seeds is not None else params.train.seeds:
        history = read_jsonl(Path(runs.format(seed=seed)) / "history.jsonl")
        base = base_rewards(params, a.method, seed, len(history))
        paired = [{"d": row["reward/mean"] - b} for row, b in zip(history, base)]
        raw, pr = reward_rise(history, a.window), reward_rise(paired, a.window, key="d")
        print(f"| {seed} | {len(history)} | {raw['z']:.1f} ({raw['rise']:+.3f}, {raw['se']:.3f}) "
              f"| {pr['z']:.1f} ({pr['rise']:+.3f}, {pr['se']:.3f}) | {paired[0]['d']:+.2e} |", flush=True)


if __name__ == "__main__":
    main()

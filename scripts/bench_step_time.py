"""Benchmark: training step times per method, side by side in one process.

    .venv/bin/python scripts/bench_step_time.py [--params params.yaml] [--steps 6] \
        [--methods grpo,mar_grpo] [--device auto] [--dtype float32] [-S train.group_size=4]

For a profile, merge it into a copy first (scripts/gpu_check.sh does):
    cp params.yaml /tmp/p.yaml && python -m pipeline.profile params_gpu.yaml --params /tmp/p.yaml --apply

Each method after the first is compared with the first (any method of params.yaml). On the
CPU (or with --legacy) every method also runs with the old per-image-generator rollout
noise (margrpo.benchtools.legacy_rollout), so the old and new step times print side by
side. All trainers start from the same base model and alternate steps (so machine load hits
them alike); a step is rollout + reward + selection/estimator draws + loss + update.
Targets (issues): MAR-GRPO / GRPO <= 1.3 at num_trajectories=4, k=0.3; a 512-image step
<= 1.0 s on one H200; on the CPU no step slower than the old path by more than 5%.
"""
from __future__ import annotations

import argparse
import contextlib

from margrpo.benchtools import add_runtime_args, legacy_rollout, median, report_memory, resolve, timed
from margrpo.config import load_params, parse_overrides
from margrpo.rl.trainer import Trainer
from margrpo.world.prompts import make_prompt_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--methods", default="grpo,mar_grpo")
    ap.add_argument("--legacy", action="store_true", help="time the old rollout noise on CUDA too")
    ap.add_argument("-S", dest="sets", action="append", default=[], help="dotted key=value override")
    add_runtime_args(ap)
    a = ap.parse_args()
    device = resolve(a)
    params = load_params(a.params, parse_overrides(a.sets) | {"runtime.device": a.device, "runtime.dtype": a.dtype})
    prompts = make_prompt_set("train", params.world.train_prompts_per_tag, params.world.seed)
    names = a.methods.split(",")
    variants = {"new": contextlib.nullcontext}
    if device.type == "cpu" or a.legacy:
        variants["old"] = legacy_rollout
    trainers = {(n, v): Trainer.from_params(params, n, 0, prompts) for n in names for v in variants}
    t = params.train
    print(f"{device} ({a.dtype}); batch: {t.prompts_per_step} prompts x {t.group_size} images; loss on "
          f"{t.loss_ar_steps or 'all'} AR steps x {t.loss_head_steps} head steps; M={params.num_trajectories}, "
          f"k={params.k}, tau={params.tau}")
    times: dict[tuple, list[float]] = {key: [] for key in trainers}
    parts: dict[tuple, list[float]] = {key: [] for key in trainers}
    for s in range(a.steps + 1):
        for (n, v), tr in trainers.items():
            with variants[v]():
                out: dict = {}
                dt = timed(lambda: out.update(tr.train_step()), device)
            if s > 0:  # step 0 is warm-up
                times[(n, v)].append(dt)
                parts[(n, v)].append(out["time/rollout"])
    for n in names:
        line = "  ".join(f"{v}: step {median(times[(n, v)]):.3f} s (rollout {median(parts[(n, v)]):.3f} s)"
                         for v in variants)
        print(f"{n:>12}: {line}")
        if "old" in variants:
            print(f"{n:>12}: new / old step time {median(times[(n, 'new')]) / median(times[(n, 'old')]):.3f} "
                  "(target <= 1.05 on the CPU)")
    for n in names[1:]:
        r = median(times[(n, "new")]) / median(times[(names[0], "new")])
        print(f"ratio {n}/{names[0]}: {r:.2f} (target <= 1.3)")
    report_memory(device)


if __name__ == "__main__":
    main()

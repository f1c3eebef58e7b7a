"""Benchmark: time to sample 64 images (16 AR steps, 20 head steps, CFG) with the base model.

    .venv/bin/python scripts/bench_sampling.py [--checkpoint models/base] [--repeats 3]

Prints one line per repeat and the median; the target is <= 5 s on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from margrpo.models.mar import TinyMAR
from margrpo.world.prompts import make_prompt_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="models/base")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--ar-steps", type=int, default=16)
    ap.add_argument("--head-steps", type=int, default=20)
    ap.add_argument("--cfg", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    model = TinyMAR.from_pretrained(a.checkpoint).eval()
    model.configure_sampling(a.ar_steps, a.head_steps, a.cfg)
    prompts = [m["prompt"] for m in make_prompt_set("heldout", 8, seed=0)][: a.images]
    prompts = (prompts * (a.images // len(prompts) + 1))[: a.images]
    print(f"torch threads: {torch.get_num_threads()}; {a.images} images, {a.ar_steps} AR steps, "
          f"{a.head_steps} head steps, cfg {a.cfg}")
    model.rollout(prompts[:4], generator=torch.Generator().manual_seed(0))  # warm-up
    times = []
    for r in range(a.repeats):
        t = time.perf_counter()
        model.rollout(prompts, generator=torch.Generator().manual_seed(r))
        times.append(time.perf_counter() - t)
        print(f"repeat {r}: {times[-1]:.2f} s")
    print(f"median: {statistics.median(times):.2f} s for {a.images} images (target <= 5 s)")


if __name__ == "__main__":
    main()

"""Benchmark: time to sample N images (16 AR steps, 20 head steps, CFG) with the base model.

    .venv/bin/python benchmarks/sampling.py [--images 64] [--repeats 3] [--device auto] [--dtype float32]

Times the rollout (vectorised counter-based draws, models/noise.py) after one warm-up.
Prints each repeat, the median, and peak GPU memory on CUDA. Targets: 64 images <= 5 s on 2 CPU cores; 512 images <= 0.3 s
on one H200.
"""
from __future__ import annotations

import argparse

import torch

from margrpo.benchtools import add_runtime_args, median, report_memory, resolve, timed
from margrpo.models.device import place
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
    add_runtime_args(ap)
    a = ap.parse_args()
    device = resolve(a)
    model = place(TinyMAR.from_pretrained(a.checkpoint).eval(), a.device, a.dtype)
    model.configure_sampling(a.ar_steps, a.head_steps, a.cfg)
    prompts = [m["prompt"] for m in make_prompt_set("heldout", 8, seed=0)]
    prompts = (prompts * (a.images // len(prompts) + 1))[: a.images]
    target = "<= 0.3 s for 512 images on one H200" if device.type == "cuda" else "<= 5 s for 64 images on 2 cores"
    print(f"{device} ({a.dtype}), torch threads {torch.get_num_threads()}: {a.images} images, {a.ar_steps} AR steps, "
          f"{a.head_steps} head steps, cfg {a.cfg}; target {target}")
    model.rollout(prompts[: min(8, a.images)], generator=torch.Generator().manual_seed(0))  # warm-up
    times: list[float] = []
    for r in range(a.repeats):
        gen = torch.Generator().manual_seed(r)
        times.append(timed(lambda: model.rollout(prompts, generator=gen), device))
        print(f"repeat {r}: {times[-1]:.3f} s")
    print(f"median: {median(times):.3f} s for {a.images} images")
    report_memory(device)


if __name__ == "__main__":
    main()

"""One torchrun rank on DEVICE for tests/test_device_paths.py: the process group a stage joins
(NCCL on CUDA, gloo on the CPU) and its collectives, then a short tiny mar_grpo training run.

    python -m margrpo.ranks.launch --standalone --nproc-per-node=1 -m one_rank_worker ROOT DEVICE

Reads the base model in ROOT/base; writes ROOT/collectives.json and the run in ROOT/rank/.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from margrpo.ranks.distributed import init, shutdown
from margrpo.study import train_run
from margrpo.world.prompts import make_prompt_set

from conftest import tiny_params

# 2 steps at the study's lr; no held-out evaluation (test_distributed.py covers it)
RUN = {"train.steps": 2, "train.lr": 1e-4, "train.checkpoint_every": 2, "train.lr_schedule": "constant",
       "train.warmup_steps": 0}


def run_params(device: str):
    return tiny_params(**RUN, **{"runtime.device": device})


def main(root: Path, device: str) -> None:
    world = init(device)
    try:
        ones = torch.full((3,), 2.0, device=world.device)
        dist.all_reduce(ones)
        gathered: list = [None] * world.size
        dist.all_gather_object(gathered, {"rank": world.rank})
        dist.barrier()
        (root / "collectives.json").write_text(json.dumps({
            "backend": dist.get_backend(), "rank": world.rank, "size": world.size, "device": world.device.type,
            "all_reduce": ones.tolist(), "gathered": gathered}))
        train_run(run_params(device), "mar_grpo", 0, root / "rank", train_prompts=make_prompt_set("train", 2, seed=0),
                  progress=False, checkpoint=str(root / "base"))
    finally:
        shutdown()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2])

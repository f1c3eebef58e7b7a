"""The runs test_distributed.py compares, in one process or as torchrun ranks.

    python -m distributed_worker ROOT single [--train-only]     # one plain process
    python -m margrpo.ranks.launch --standalone --nproc-per-node=2 -m distributed_worker ROOT ddp
    # two "nodes" of one rank each: the same command twice, meeting at a c10d rendezvous
    python -m margrpo.ranks.launch --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:PORT \
        --nproc-per-node=1 -m distributed_worker ROOT nodes --train-only

Each invocation, on the base model in ROOT/base and the same params (`worker_params`):
- eval: sample_and_score of every held-out image -> ROOT/eval_<phase>.pt (scores and images);
- full: train_run of mar_grpo for 4 steps with held-out evaluation -> ROOT/full_<phase>/;
- switch: ddp trains ROOT/switch to step 2; single resumes it to step 4 (a changed world size).
--train-only: full alone, and ROOT/place_<phase>_<rank>.json: where torchrun placed the rank.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from margrpo.ranks.distributed import current, init, shutdown
from margrpo.study import sample_and_score, train_run
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.generate import image_seeds
from margrpo.world.prompts import make_prompt_set

from conftest import tiny_params

STEPS = 4


def worker_params(steps: int = STEPS, **overrides):
    """Tiny mar_grpo with every collective path on: top-k, consistency, speculative tokens,
    posterior draws, KL reference, gradient probe (with its second draw), held-out
    evaluation in batches that do not split evenly over two ranks. The study's lr, 1e-4:
    AdamW's first steps move a weight by lr * g / (|g| + eps), so a gradient component near
    eps = 1e-8 turns the rounding of a sum split over two ranks (~1e-11) into ~lr * 1e-3;
    at the tests' usual 1e-3 one such component of qkv.weight differs by 1.25e-6. overrides:
    more dotted keys (the ranks' runtime of a launch test)."""
    return tiny_params(**{
        "train.steps": steps, "train.lr": 1e-4, "train.checkpoint_every": 2, "train.eval_every": 2, "train.eval_images_per_prompt": 2,
        "train.grad_probe_every": 2, "train.beta_kl": 0.05, "train.lr_schedule": "constant", "train.warmup_steps": 0,
        "evaluate.batch_size": 3, **overrides,
    })


def heldout() -> list[dict]:
    return [m for m in make_prompt_set("heldout", 1, seed=3) if m.get("tag")]


def run(root: Path, phase: str, train_only: bool = False) -> None:
    world = current()
    params = worker_params()
    base = str(root / "base")
    train_prompts = make_prompt_set("train", 2, seed=0)
    metas = heldout()

    def train(out: str, steps: int = STEPS) -> None:
        train_run(worker_params(steps), "mar_grpo", 0, root / out, train_prompts=train_prompts,
                  heldout_prompts=metas, progress=False, checkpoint=base)

    if train_only:
        # where torchrun placed this process: its rank, world size and node (GROUP_RANK)
        place = {k: int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE")
                 if k in os.environ}
        (root / f"place_{phase}_{world.rank}.json").write_text(json.dumps(place))
        train(f"full_{phase}")
        return

    from margrpo.models.loading import load_model

    seeds = image_seeds(7, 0, len(metas), 3)
    n = len(metas) * 3
    scores, images = sample_and_score(load_model(base, params), metas, seeds, 4, WorldEvaluator(32), keep=range(n))
    if world.main:
        torch.save({"scores": {k: v for k, v in scores.items() if k != "metadata"},
                    "images": torch.stack([images[i] for i in range(n)])}, root / f"eval_{phase}.pt")

    train(f"full_{phase}")
    if phase == "ddp":
        train("switch", steps=2)
    else:
        train("switch")


if __name__ == "__main__":
    torch.set_num_threads(1)
    init("cpu")
    run(Path(sys.argv[1]), sys.argv[2], train_only="--train-only" in sys.argv[3:])
    shutdown()

"""Study composition: the pieces the pipeline, the scripts and the tests build from params.

The library's layers stay independent of one another (training/ knows no world, the world knows
no trainer); this module, at the top, wires them for the embedded study:

- `sample_and_score`: images of fixed per-image seeds, sampled and scored in batches shared
  over the data-parallel ranks (ranks/distributed.py), exact per-image scores gathered;
- `heldout_evaluator`: a callable policy -> held-out metrics by the evaluation judge
  (eval/geneval/<tag>, eval/geneval/overall, eval/t2i/..., eval/partial) and by the training
  reward's detector (eval/proxy/...), sampling fixed per-image seeds so that every call,
  method and seed scores the same prompts with the same noise;
- `train_run`: one (method, seed) trained with held-out evaluation during training and the
  judge watching every training batch.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import torch

from margrpo.config import Params


@torch.no_grad()
def sample_and_score(policy, metas: list[dict], seeds: torch.Tensor, batch_size: int, evaluator, *,
                     keep: Iterable[int] = (), progress: bool = False,
                     desc: str = "sample") -> tuple[dict, dict[int, torch.Tensor]]:
    """Sample and score seeds.shape[1] images per prompt (seeds [P, K], prompt-major).

    Batches of batch_size flat images are dealt round-robin to the ranks (one rank: all of
    them, in order); each rank rolls out and scores its batches with `evaluator` (images
    on the CPU), and every rank gets all scores back. A batch holds the same images as in a
    single process, so the scores are exactly the single-process ones. Returns (the
    evaluator's per-image tensors [P*K] plus "metadata" (one row per image), the images
    [3, H, W] of the flat indices in `keep`, by index).
    """
    from tqdm.auto import tqdm

    from margrpo.ranks.distributed import current, map_batches, my_batches

    world = current()
    per_prompt = seeds.shape[1]
    flat = [m for m in metas for _ in range(per_prompt)]
    prompts, flat_seeds, keep = [m["prompt"] for m in flat], seeds.reshape(-1), set(keep)
    bar = tqdm(total=len(my_batches(len(flat), batch_size, world)), desc=desc,
               disable=not (progress and world.main), mininterval=2)

    def batch(sl: slice) -> tuple[dict, dict]:
        images = policy.rollout(prompts[sl], seeds=flat_seeds[sl]).images.cpu()
        scored = evaluator.score(images, flat[sl])
        bar.update(1)
        return ({k: v for k, v in scored.items() if torch.is_tensor(v)},
                {i: images[i - sl.start] for i in range(sl.start, sl.stop) if i in keep})

    parts = map_batches(batch, len(flat), batch_size, world)
    bar.close()
    scores = {k: torch.cat([p[0][k] for p in parts]) for k in parts[0][0]}
    scores["metadata"] = flat
    return scores, {i: im for p in parts for i, im in p[1].items()}


def heldout_evaluator(params: Params, metas: list[dict], per_prompt: int, *, replicate: int = 0,
                      batch_size: int | None = None) -> Callable[[object], dict[str, float]]:
    """policy -> summary metrics on `metas` (per_prompt images each, seeds from
    evaluate.seed and `replicate`). The policy is put in eval mode. In a data-parallel run
    every rank calls it (sample_and_score) and gets the same metrics."""
    from margrpo.world.generate import image_seeds, summarize
    from margrpo.world.judge import JudgedEvaluator

    seeds = image_seeds(params.evaluate.seed, replicate, len(metas), per_prompt)
    evaluator = JudgedEvaluator(params.world.image_size)

    def evaluate(policy) -> dict[str, float]:
        scores, _ = sample_and_score(policy.eval(), metas, seeds, batch_size or params.evaluate.batch_size, evaluator)
        return summarize(scores)

    return evaluate


def train_run(params: Params, method: str, seed: int, out_dir: Path, *, train_prompts: list[dict],
              heldout_prompts: list[dict] | None = None, log=None, progress: bool = True,
              checkpoint: str | None = None) -> Path:
    """Train one (method, seed) into out_dir (training/loop.py), evaluating the GenEval-tag
    prompts of `heldout_prompts` during training. Returns out_dir/final."""
    from margrpo.training.loop import train
    from margrpo.training.trainer import Trainer
    from margrpo.world.judge import JudgedEvaluator

    # The judge watches every training batch (judge/correct beside the reward's own
    # judge/proxy_correct); it never feeds the reward.
    monitor = JudgedEvaluator(params.world.image_size).batch_metrics
    trainer = Trainer.from_params(params, method, seed, train_prompts, checkpoint=checkpoint, monitor=monitor)
    evaluate = None
    if heldout_prompts:
        tagged = [m for m in heldout_prompts if m.get("tag")]
        evaluate = heldout_evaluator(params, tagged, params.train.eval_images_per_prompt)
    return train(trainer, out_dir, evaluate=evaluate, log=log, progress=progress)

"""Reward "world": the embedded world's verifiable evaluator as an RL reward (the
reward table's entry "world").

params.yaml: `rewards: [{name: world, mode: aligned, image_size: 32}]`.

mode:
- "aligned" (default): (GenEval-correct + "partial" with one more requirement, nothing
  unrequested) / 2. Its maximum needs a GenEval-correct image with no extra object; a
  missing or extra object, a wrong attribute or count or a broken relation always lowers
  it, and the partial half keeps it dense (tests/test_reward_alignment.py).
- "partial": fraction of the prompt's requirements met (objects, counts, attributes,
  exclusions, relation). Dense: a GRPO group of a tiny model rarely has all images right or
  all wrong, so advantages are rarely all zero, unlike a 0/1 reward; but it can be raised
  while the evaluation falls (colours traded for shapes, method.md §3.3).
- "geneval": GenEval 0/1 correctness; "t2i": T2I-CompBench-style category score.
  A prompt outside that benchmark (no tag, or no category) has no such score; it falls
  back to the other benchmark's score, then to "partial", so every image gets a reward.
- "mix": mean of the scores available for the prompt (geneval, t2i, partial).
"""
from __future__ import annotations

import torch

from margrpo.rewards.table import WORLD_MODES as MODES
from margrpo.world.evaluator import WorldEvaluator


class WorldReward:
    name = "world"

    def __init__(self, mode: str = "aligned", image_size: int = 32):
        if mode not in MODES:
            raise ValueError(f"rewards[world].mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.evaluator = WorldEvaluator(image_size=image_size)
        self.last_scores: dict = {}

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        if len(metadata) != images.shape[0]:
            raise ValueError(f"reward world needs one metadata dict per image: "
                             f"{images.shape[0]} images, {len(metadata)} metadata rows")
        s = self.evaluator.score(images, metadata)
        self.last_scores = s
        geneval, t2i, partial = s["geneval"], s["t2i"], s["partial"]
        if self.mode == "partial":
            return partial
        if self.mode == "aligned":
            return s["aligned"]
        if self.mode == "geneval":
            return torch.where(geneval.isnan(), torch.where(t2i.isnan(), partial, t2i), geneval)
        if self.mode == "t2i":
            return torch.where(t2i.isnan(), torch.where(geneval.isnan(), partial, geneval), t2i)
        stacked = torch.stack([geneval, t2i, partial])          # [3, B]
        return stacked.nanmean(0)

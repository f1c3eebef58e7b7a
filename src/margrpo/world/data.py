"""The world as pretraining data: endless rendered (image, prompt) batches of the train split.

Each batch draws train-split prompt combinations balanced over the world's purposes
(GenEval tags and T2I categories) that have any (the test-only tags have none), samples a scene that satisfies each and renders it.
Every draw comes from the generator the caller passes, so pretraining stays a pure function
of its seed (margrpo.models.pretrain shares one generator between data and masking).
"""
from __future__ import annotations

import torch

from margrpo.world.prompts import PURPOSES, combinations, sample_scenes
from margrpo.world.render import render


class WorldBatches:
    """Data source of margrpo.models.pretrain: sample(batch_size, generator) ->
    (images [B, 3, H, W] float32 in [0, 1], prompts [B])."""

    def __init__(self, image_size: int):
        # Test-only tags have no training combinations (world/prompts.py TEST_ONLY).
        self.pools = [pool for pool in (combinations(p, "train") for p in PURPOSES) if pool]
        self.size = image_size

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, list[str]]:
        gen = generator
        purpose = torch.randint(len(self.pools), (batch_size,), generator=gen).tolist()
        metas = [self.pools[p][int(torch.randint(len(self.pools[p]), (1,), generator=gen))] for p in purpose]
        images = render(sample_scenes(metas, gen, size=self.size), self.size)
        return images, [m["prompt"] for m in metas]

"""PickScore (Kirstain et al. 2023): a CLIP-H fine-tuned on Pick-a-Pic preferences.

score = logit_scale.exp() * cos(image, text), about 20-23 for real images with the real
weights (logit_scale.exp() = 100). Weights: the PickScore_v1 model folder (transformers
CLIPModel layout) and the CLIP-ViT-H-14-laion2B processor folder, both local.

Install: `pip install -e .[transformers]` (core env).
"""
from __future__ import annotations

import torch

from margrpo.rewards.clipscore import HFClip


class PickScoreReward:
    name = "pickscore"

    def __init__(self, model_path: str, processor_path: str | None = None, batch_size: int = 16,
                 device: str = "auto", dtype: str = "auto"):
        self.clip = HFClip(self.name, model_path, processor_path, device, dtype)
        self.batch_size = int(batch_size)
        self.scale = float(self.clip.model.logit_scale.detach().float().exp().cpu())

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        return self.scale * self.clip.cosine(images, prompts, self.batch_size)

"""CLIPScore (Hessel et al. 2021) on a transformers CLIP checkpoint from a local folder.

score = w * max(cos(image, text), 0), w = 2.5 by default as in the paper (the paper's
tables multiply by 100 on top). The same `HFClip` wrapper serves PickScore, the aesthetic
predictor's ViT-L/14 and the T2I-CompBench non-spatial CLIP metric.

Install: `pip install -e .[transformers]` (core env; transformers 5, no torchvision).
"""
from __future__ import annotations

from typing import Any

import torch

from margrpo.rewards.clip_common import (batched_scores, pick_device, pick_dtype, require_module,
                                         require_paths, set_offline, to_pil)

EXTRA = "pip install -e '.[transformers]'"


def _features(out: Any) -> torch.Tensor:
    # transformers 5 returns an output object from get_*_features; 4.x returns a tensor.
    if isinstance(out, torch.Tensor):
        return out
    return out.pooler_output


class HFClip:
    """A transformers CLIPModel + its processor, loaded once from local dirs.

    model_path: folder with config.json + weights (save_pretrained layout).
    processor_path: folder with the processor / tokenizer files (default: model_path).
    """

    def __init__(self, backend: str, model_path: str, processor_path: str | None = None,
                 device: str = "auto", dtype: str = "auto", model_param: str = "model_path"):
        # model_param: the params.yaml key that set model_path, named in start-up errors.
        model_dir = require_paths(backend, EXTRA, **{model_param: model_path})[model_param]
        proc_dir = model_dir
        if processor_path:
            proc_dir = require_paths(backend, EXTRA, processor_path=processor_path)["processor_path"]
        set_offline()
        transformers = require_module("transformers", backend, EXTRA)
        self.device = pick_device(device)
        self.dtype = pick_dtype(self.device, dtype)
        self.model = transformers.CLIPModel.from_pretrained(
            str(model_dir), local_files_only=True, dtype=self.dtype
        ).to(self.device).eval()
        self.processor = transformers.CLIPProcessor.from_pretrained(
            str(proc_dir), local_files_only=True
        )

    @torch.no_grad()
    def image_embeds(self, pil_images: list) -> torch.Tensor:
        """[B, D] float32 projected image embeddings (not normalised)."""
        pix = self.processor(images=pil_images, return_tensors="pt")["pixel_values"]
        pix = pix.to(self.device, self.dtype)
        return _features(self.model.get_image_features(pixel_values=pix)).float()

    @torch.no_grad()
    def text_embeds(self, texts: list[str]) -> torch.Tensor:
        """[B, D] float32 projected text embeddings; texts truncated to the model's 77 tokens."""
        tok = self.processor(text=list(texts), return_tensors="pt", padding=True,
                             truncation=True, max_length=self.model.config.text_config.max_position_embeddings)
        tok = {k: v.to(self.device) for k, v in tok.items() if k in ("input_ids", "attention_mask")}
        return _features(self.model.get_text_features(**tok)).float()

    def cosine(self, images: torch.Tensor, prompts: list[str], batch_size: int) -> torch.Tensor:
        """[B] cosine of image and prompt embeddings, computed in batches."""

        def score(sl: slice) -> torch.Tensor:
            img = torch.nn.functional.normalize(self.image_embeds(to_pil(images[sl])), dim=-1)
            txt = torch.nn.functional.normalize(self.text_embeds(list(prompts[sl])), dim=-1)
            return (img * txt).sum(-1).cpu()

        return batched_scores(images, prompts, batch_size, score)


class CLIPScoreReward:
    name = "clipscore"

    def __init__(self, model_path: str, processor_path: str | None = None, weight_w: float = 2.5,
                 batch_size: int = 32, device: str = "auto", dtype: str = "auto"):
        self.clip = HFClip(self.name, model_path, processor_path, device, dtype)
        self.w = float(weight_w)
        self.batch_size = int(batch_size)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        return self.w * self.clip.cosine(images, prompts, self.batch_size).clamp_min(0)

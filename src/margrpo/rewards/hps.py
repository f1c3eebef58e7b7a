"""HPSv2 / HPSv2.1 (Wu et al. 2023): a fine-tuned OpenCLIP ViT-H-14; score = cosine of the
normalised image and prompt embeddings (no logit scale), about 0.2-0.35 for real images.

Why upstream open_clip and not the hpsv2 package's own model code: hpsv2 1.2 vendors an old
open_clip copy, its wheel lacks the BPE vocabulary file, it pins pytest==7.2 / protobuf<4 as
runtime dependencies, and `hpsv2.score()` fetches the 3.9 GB LAION base from the hub and
re-reads the 2 GB HPS checkpoint on every call. The HPS v2 / v2.1 state dict loads strictly
into upstream `open_clip.create_model('ViT-H-14', pretrained=None)` (686/686 keys), so this
backend builds that model once with no base weights, loads the HPS checkpoint into it, and
scores batches. Preprocessing follows hpsv2's: long side to 224 (bicubic), zero-pad to a
square, OpenAI mean/std.

Weights: `checkpoint` = HPS_v2_compressed.pt or HPS_v2.1_compressed.pt (a local file).
Install: open_clip needs torchvision, which does not import next to the core's torch 2.13
CPU wheel, so run it from `.venvs/openclip` (scripts/setup_backend_env.sh openclip):
in process there, or from the core through `python: .venvs/openclip/bin/python`.
"""
from __future__ import annotations

from typing import Any

import torch

from margrpo.rewards.clip_common import (batched_scores, normalize, pick_device, pick_dtype,
                                         require_module, require_paths, resize_pad_square)
from margrpo.rewards.remote import maybe_remote

EXTRA = ("scripts/setup_backend_env.sh openclip (or pip install -e '.[openclip]' in an env "
         "with torch 2.14.1 + torchvision 0.29.1), then set rewards[].python: "
         ".venvs/openclip/bin/python")


def load_state_dict(path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    state = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else ckpt
    # Checkpoints saved from DistributedDataParallel prefix every key with "module.".
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}


class HPSReward:
    name = "hpsv2"

    def __init__(self, checkpoint: str, model_name: str = "ViT-H-14", model_config: str | None = None,
                 batch_size: int = 16, device: str = "auto", dtype: str = "auto"):
        """model_config: optional open_clip JSON config file registered under its file stem
        (tests use a tiny one; the real HPS needs none)."""
        paths = require_paths(self.name, EXTRA, checkpoint=checkpoint,
                              **({"model_config": model_config} if model_config else {}))
        open_clip = require_module("open_clip", self.name, EXTRA)
        if model_config:
            open_clip.add_model_config(str(paths["model_config"]))
        self.device = pick_device(device)
        self.dtype = pick_dtype(self.device, dtype)
        model = open_clip.create_model(model_name, pretrained=None)
        model.load_state_dict(load_state_dict(paths["checkpoint"]), strict=True)
        self.model = model.to(self.device, self.dtype).eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        size = model.visual.image_size
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.batch_size = int(batch_size)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [0, 1] -> [B, 3, S, S] normalised, S = the model's image size."""
        return normalize(resize_pad_square(images, self.image_size))

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        def score(sl: slice) -> torch.Tensor:
            pix = self.preprocess(images[sl]).to(self.device, self.dtype)
            tok = self.tokenizer(list(prompts[sl])).to(self.device)
            img = torch.nn.functional.normalize(self.model.encode_image(pix).float(), dim=-1)
            txt = torch.nn.functional.normalize(self.model.encode_text(tok).float(), dim=-1)
            return (img * txt).sum(-1).cpu()

        return batched_scores(images, prompts, self.batch_size, score)


def build(**kwargs: Any):
    """Table entry "hpsv2": in process, or in its own env when `python` / `url` is set."""
    return maybe_remote("hpsv2", kwargs) or HPSReward(**kwargs)

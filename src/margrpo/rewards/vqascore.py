"""VQAScore (Lin et al. 2024) through t2v-metrics 1.2: how likely a CLIP-FlanT5 model answers
"Yes" to 'Does this figure show "{prompt}"? Please answer yes or no.', in [0, 1].

Exactly, the package returns exp(-mean cross-entropy) over the tokenised answer, i.e. the
geometric mean of the per-token probabilities of "Yes" + "</s>" (Flan-T5 tokenises "Yes" as
one piece, so this is sqrt(P(Yes) * P(</s> | Yes))), teacher-forced after the prompt.

Local weights: t2v-metrics resolves a model name through its registry
(CLIP_T5_MODELS); this backend adds one entry whose paths are the local folders, so nothing
is fetched: `model_path` (e.g. the clip-flant5-xl folder), `tokenizer_path` (the
google/flan-t5-xl tokenizer folder, read with the slow sentencepiece T5Tokenizer) and
`vision_tower_path` (the CLIP ViT-L/14-336 folder; the model's config.json field
`mm_vision_tower` must name this same folder, which is checked at start-up). Scoring calls
the package model's paired `forward(image_paths, texts)` on whole batches (the package's
`VQAScore(...)` call scores an m x n grid).

Environment: t2v-metrics 1.2 pins transformers==4.36.1 and needs diffusers 0.31, so it runs
from .venvs/legacy (scripts/setup_backend_env.sh legacy) behind the loopback scorer:
`python: .venvs/legacy/bin/python` in the reward's params. The package casts the model to
bf16 on every device; its forward only autocasts on CUDA, so on CPU we wrap it in a bf16
autocast ourselves: CPU runs the same bf16 mixed precision as a GPU.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from margrpo.rewards.clip_common import (check_batch, chunks, pick_device, require_module,
                                         require_paths, set_offline, to_pil)
from margrpo.rewards.remote import maybe_remote

EXTRA = ("scripts/setup_backend_env.sh legacy, then set rewards[].python: "
         ".venvs/legacy/bin/python (pip install -e '.[vqascore]' into an env of its own)")
LOCAL_NAME = "margrpo-local-clip-t5"


class VQAScoreReward:
    name = "vqascore"

    def __init__(self, model_path: str, tokenizer_path: str, vision_tower_path: str,
                 conversation: str = "t5_chat", batch_size: int = 8, device: str = "auto"):
        paths = require_paths(self.name, EXTRA, model_path=model_path,
                              tokenizer_path=tokenizer_path, vision_tower_path=vision_tower_path)
        cfg_file = paths["model_path"] / "config.json"
        tower = json.loads(cfg_file.read_text()).get("mm_vision_tower") if cfg_file.exists() else None
        if tower is None or Path(tower).resolve() != paths["vision_tower_path"].resolve():
            raise FileNotFoundError(
                f"vqascore: {cfg_file} must set \"mm_vision_tower\" to the local vision tower "
                f"{paths['vision_tower_path']} (param rewards[].vision_tower_path); it has {tower!r}, "
                "which would be fetched from the hub."
            )
        set_offline()
        t2v = require_module("t2v_metrics", self.name, EXTRA)
        clip_t5 = require_module("t2v_metrics.models.vqascore_models.clip_t5_model", self.name, EXTRA)
        clip_t5.CLIP_T5_MODELS[LOCAL_NAME] = {
            "tokenizer": {"path": str(paths["tokenizer_path"]), "model_max_length": clip_t5.CONTEXT_LEN},
            "model": {"path": str(paths["model_path"]), "conversation": conversation,
                      "image_aspect_ratio": "pad"},
        }
        self.device = pick_device(device)
        # The package creates its cache_dir (default ./hf_cache/, relative to the cwd) at
        # load; nothing is downloaded here, so point it at the existing model folder.
        self.scorer = t2v.VQAScore(model=LOCAL_NAME, device=str(self.device),
                                   cache_dir=str(paths["model_path"]))
        self.batch_size = int(batch_size)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        check_batch(images, prompts)
        out = []
        with tempfile.TemporaryDirectory(prefix="margrpo-vqascore-") as tmp:
            files = []
            for i, im in enumerate(to_pil(images)):
                files.append(f"{tmp}/{i:06d}.png")
                im.save(files[-1])  # the package reads images from files
            for sl in chunks(len(files), self.batch_size):
                autocast = torch.autocast(self.device.type, dtype=torch.bfloat16)
                with autocast:
                    s = self.scorer.model.forward(files[sl], list(prompts[sl]))
                out.append(torch.as_tensor(s).float().reshape(-1).cpu())
        return torch.cat(out) if out else torch.zeros(0)


def build(**kwargs: Any):
    """Table entry "vqascore": in process, or in its own env when `python` / `url` is set."""
    return maybe_remote("vqascore", kwargs) or VQAScoreReward(**kwargs)

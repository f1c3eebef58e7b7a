"""LAION aesthetic predictor v2: an MLP on L2-normalised OpenAI CLIP ViT-L/14 image
embeddings, giving roughly a 1-10 rating. The prompt is ignored.

Weights: the openai/clip-vit-large-patch14 folder (transformers layout, `clip_path`) and
the head file `sac+logos+ava1-l14-linearMSE.pth` (~3.7 MB, `head_path`; .safetensors also
read). The head's layer indices match that file so its state dict loads strictly.

Install: `pip install -e .[transformers]` (core env).
"""
from __future__ import annotations

import torch
from torch import nn

from margrpo.rewards.clip_common import batched_scores, require_paths, to_pil
from margrpo.rewards.clipscore import EXTRA, HFClip


class AestheticHead(nn.Module):
    """768 -> 1024 -> 128 -> 64 -> 16 -> 1, dropouts between (inactive in eval)."""

    def __init__(self, input_size: int = 768):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(input_size, 1024), nn.Dropout(0.2),
            nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1),
            nn.Linear(64, 16),
            nn.Linear(16, 1),
        )

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.layers(emb).squeeze(-1)


def load_head_state(path) -> dict[str, torch.Tensor]:
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return state.get("state_dict", state)


class AestheticReward:
    name = "aesthetic"

    def __init__(self, clip_path: str, head_path: str, processor_path: str | None = None,
                 batch_size: int = 32, device: str = "auto", dtype: str = "auto"):
        head_file = require_paths(self.name, EXTRA, head_path=head_path)["head_path"]
        self.clip = HFClip(self.name, clip_path, processor_path, device, dtype, model_param="clip_path")
        dim = self.clip.model.config.projection_dim
        self.head = AestheticHead(dim)
        self.head.load_state_dict(load_head_state(head_file), strict=True)
        self.head.to(self.clip.device).eval()
        self.batch_size = int(batch_size)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        def score(sl: slice) -> torch.Tensor:
            emb = torch.nn.functional.normalize(self.clip.image_embeds(to_pil(images[sl])), dim=-1)
            return self.head(emb.to(self.clip.device)).float().cpu()

        return batched_scores(images, prompts, self.batch_size, score)

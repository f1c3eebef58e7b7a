"""Smoke scoring with real weights (marker `realweights`): skipped unless MARGRPO_WEIGHTS
points at a folder laid out as in docs/backends.md. Each check skips alone when its files
or its package are missing; HPS / ImageReward / VQAScore go through their venvs' servers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from margrpo.rewards.base import build_reward

pytestmark = pytest.mark.realweights
W = Path(os.environ["MARGRPO_WEIGHTS"]) if os.environ.get("MARGRPO_WEIGHTS") else None
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["a red apple on a white table", "a red apple on a white table"]


def weights(*parts: str) -> Path:
    if W is None:
        pytest.skip("set MARGRPO_WEIGHTS to a folder of real weights (docs/backends.md)")
    p = W.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present")
    return p


def images() -> torch.Tensor:
    x = torch.ones(2, 3, 256, 256)
    x[0, 1:] = 0.1  # a red square vs a white one
    return x


def venv(name: str) -> str:
    py = ROOT / ".venvs" / name / "bin" / "python"
    if not py.exists():
        pytest.skip(f"{py} missing: scripts/setup_backend_env.sh {name}")
    return str(py)


@pytest.mark.parametrize("name,kwargs,lo,hi", [
    ("clipscore", lambda: {"model_path": str(weights("clip-vit-base-patch32"))}, 0.0, 2.5),
    ("pickscore", lambda: {"model_path": str(weights("PickScore_v1")),
                           "processor_path": str(weights("CLIP-ViT-H-14-laion2B-s32B-b79K"))}, 5, 35),
    ("aesthetic", lambda: {"clip_path": str(weights("clip-vit-large-patch14")),
                           "head_path": str(weights("aesthetic", "sac+logos+ava1-l14-linearMSE.pth"))}, 0, 10),
    ("hpsv2", lambda: {"checkpoint": str(weights("HPS_v2.1_compressed.pt")), "python": venv("openclip")}, 0, 1),
    ("imagereward", lambda: {"checkpoint": str(weights("ImageReward", "ImageReward.pt")),
                             "med_config": str(weights("ImageReward", "med_config.json")),
                             "bert_tokenizer": str(weights("bert-base-uncased")),
                             "python": venv("legacy")}, -3, 3),
    ("vqascore", lambda: {"model_path": str(weights("clip-flant5-xl")),
                          "tokenizer_path": str(weights("flan-t5-xl")),
                          "vision_tower_path": str(weights("clip-vit-large-patch14-336")),
                          "python": venv("legacy")}, 0, 1),
])
def test_real_backend_smoke(name, kwargs, lo, hi):
    if name in ("clipscore", "pickscore", "aesthetic"):
        pytest.importorskip("transformers")
    reward = build_reward(name, **kwargs())
    s = reward(images(), PROMPTS, [{}, {}])
    print(name, s.tolist())
    assert s.shape == (2,) and torch.isfinite(s).all() and ((s >= lo) & (s <= hi)).all()
    if hasattr(reward, "close"):
        reward.close()

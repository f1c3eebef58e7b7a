"""Every backend checks its weight paths before importing or loading anything heavy: a
missing path fails in milliseconds with the path, the params key and the install route."""
from __future__ import annotations

import pytest

from margrpo.rewards.base import build_reward

CASES = [
    ("aesthetic", lambda t: {"clip_path": str(t), "head_path": str(t / "nope.pth")},
     ["nope.pth", "rewards[].head_path", "[transformers]"]),
    ("pickscore", lambda t: {"model_path": None}, ["rewards[].model_path", "is not set"]),
    ("hpsv2", lambda t: {"checkpoint": str(t / "HPS_v2.1_compressed.pt")},
     ["HPS_v2.1_compressed.pt", "rewards[].checkpoint", "setup_backend_env.sh openclip"]),
    ("imagereward", lambda t: {"checkpoint": str(t / "ImageReward.pt"), "med_config": str(t), "bert_tokenizer": str(t)},
     ["ImageReward.pt", "rewards[].checkpoint", "setup_backend_env.sh legacy"]),
    ("vqascore", lambda t: {"model_path": str(t / "clip-flant5-xl"), "tokenizer_path": str(t),
                            "vision_tower_path": str(t)},
     ["clip-flant5-xl", "rewards[].model_path", "setup_backend_env.sh legacy"]),
]


@pytest.mark.parametrize("name, kwargs, expect", CASES, ids=[c[0] for c in CASES])
def test_missing_path_names_path_param_and_install(tmp_path, name, kwargs, expect):
    with pytest.raises(FileNotFoundError) as e:
        build_reward(name, **kwargs(tmp_path))
    assert all(part in str(e.value) for part in expect), str(e.value)

"""VQAScore start-up checks. The CLIP-FlanT5 scoring path itself is not exercised on a tiny
model here (see docs/backends.md); the registration into t2v-metrics' model registry is."""
from __future__ import annotations

import json

import pytest

from margrpo.rewards.base import build_reward


def test_missing_paths_name_param_and_env(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        build_reward("vqascore", model_path=str(tmp_path / "clip-flant5-xl"),
                     tokenizer_path=str(tmp_path), vision_tower_path=str(tmp_path))
    assert "clip-flant5-xl" in str(e.value) and "rewards[].model_path" in str(e.value)
    assert "setup_backend_env.sh legacy" in str(e.value)


def test_vision_tower_must_be_local(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"mm_vision_tower": "openai/clip-vit-large-patch14-336"}))
    with pytest.raises(FileNotFoundError, match="mm_vision_tower"):
        build_reward("vqascore", model_path=str(model), tokenizer_path=str(tmp_path),
                     vision_tower_path=str(tmp_path))

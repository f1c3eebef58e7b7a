"""ImageReward through the image-reward package's model code on a tiny random BLIP text
tower (the ViT-L image tower is fixed by the package): in process in .venvs/legacy, and
from the core env through the loopback scorer started in .venvs/legacy."""
from __future__ import annotations

import pytest
import torch

from margrpo.rewards.base import build_reward

from .conftest import LEGACY_PY, legacy_fixture, random_images

PROMPTS = ["a red cube", "two dogs on a bench", "a photo of a cat"]


def test_imagereward_in_process_matches_package_score(tmp_path):
    pytest.importorskip("ImageReward", reason="image-reward lives in .venvs/legacy (scripts/test_backends.sh)")
    from .ir_fixture import write

    params = write(tmp_path)
    reward = build_reward("imagereward", batch_size=2, **params)
    images = random_images(3, 64, 48)
    s = reward(images, PROMPTS, [{}] * 3)
    assert s.shape == (3,) and torch.isfinite(s).all() and s.std() > 1e-4
    from margrpo.rewards.clip_common import to_pil

    # the package's own one-image path gives the same numbers
    ref = [reward.model.score(p, im) for p, im in zip(PROMPTS, to_pil(images))]
    torch.testing.assert_close(s, torch.tensor(ref, dtype=torch.float32), atol=1e-4, rtol=1e-4)


def test_imagereward_through_legacy_env_server(tmp_path):
    params = legacy_fixture("ir_fixture.py", tmp_path / "w")
    reward = build_reward("imagereward", python=str(LEGACY_PY), workdir=str(tmp_path / "run"),
                          batch_size=4, **params)
    try:
        s = reward(random_images(3, 64, 64), PROMPTS, [{}] * 3)
        assert s.shape == (3,) and torch.isfinite(s).all() and s.std() > 1e-4
    finally:
        reward.close()

"""Shared fixtures: tiny models and params built in the test (no downloads, seconds)."""
from __future__ import annotations

import pytest
import torch

from margrpo.config import parse_params
from margrpo.rewards.base import register_reward

TINY = {
    "model": {"width": 32, "depth": 1, "heads": 2, "cond_dim": 32, "head_width": 32, "head_depth": 1},
    "sampling": {"num_ar_steps": 4, "head_steps": 4},
    "train": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "loss_ar_steps": 2, "loss_head_steps": 2,
              "loss_head_window": 4, "checkpoint_every": 2, "grad_probe_every": 0, "lr": 1e-3},
    "rewards": [{"name": "test_red", "weight": 1.0}],
    # Tiny-model tests compare numbers on the CPU, also on a GPU machine (CUDA tests ask for it).
    "runtime": {"device": "cpu"},
    "methods": {
        "grpo": {"freeze_head": False},
        "mar_grpo": {"freeze_head": True, "estimator": "posterior", "topk": True, "consistency": True,
                     "token_scope": "committed+speculative"},
    },
}


class RedReward:
    """Mean redness of the image: a dense, deterministic reward for trainer tests."""

    name = "test_red"

    def __call__(self, images, prompts, metadata):
        return (images[:, 0] - 0.5 * (images[:, 1] + images[:, 2])).mean(dim=(1, 2))


@register_reward("test_red")
def _red(**kw):
    return RedReward()


def tiny_params(**overrides):
    """TINY on top of the code defaults (= the study's params.yaml), then dotted overrides."""
    return parse_params(TINY, "tests/conftest.py TINY", overrides)


def randomize_head(model, seed=0):
    """The head is zero-initialised (AdaLN-zero); give it random weights so tests see signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


@pytest.fixture
def tiny_model():
    from margrpo.models.loading import new_model
    from margrpo.world.grammar import VOCAB

    torch.manual_seed(0)
    return randomize_head(new_model(tiny_params(), VOCAB))

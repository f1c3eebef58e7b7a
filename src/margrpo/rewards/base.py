"""One reward interface for every scorer, and a registry keyed by name.

A reward maps a batch of images with their prompts and prompt metadata to one float per
image, higher is better:

    images:   float tensor [B, 3, H, W], RGB in [0, 1]
    prompts:  list of B strings
    metadata: list of B dicts in the prompt JSONL schema (see margrpo.world.prompts)
    returns:  float tensor [B]

Backends register a factory under a name; the factory receives the keyword arguments of
its entry in params.yaml (`rewards: [{name, weight, ...}]`). Heavy backends import their
packages inside the factory, so importing this module never imports them.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

import torch


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def __call__(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> torch.Tensor: ...


RewardFactory = Callable[..., RewardModel]
_REGISTRY: dict[str, RewardFactory] = {}


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator: make `factory(**kwargs) -> RewardModel` buildable as `name`."""

    def deco(factory: RewardFactory) -> RewardFactory:
        if name in _REGISTRY:
            raise ValueError(f"reward {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_rewards() -> list[str]:
    _import_builtin_backends()
    return sorted(_REGISTRY)


def build_reward(name: str, **kwargs: Any) -> RewardModel:
    _import_builtin_backends()
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown reward {name!r}; available: {', '.join(sorted(_REGISTRY))}. "
            "Set rewards[].name in params.yaml to one of these."
        )
    return _REGISTRY[name](**kwargs)


class WeightedReward:
    """sum_i weight_i * reward_i(images); per-component scores kept for logging."""

    name = "weighted"

    def __init__(self, components: list[tuple[RewardModel, float]]):
        if not components:
            raise ValueError("rewards: at least one reward is needed in params.yaml")
        self.components = components
        self.last_components: dict[str, torch.Tensor] = {}

    def __call__(self, images, prompts, metadata) -> torch.Tensor:
        total = torch.zeros(images.shape[0], dtype=torch.float32)
        self.last_components = {}
        for model, weight in self.components:
            scores = torch.as_tensor(model(images, prompts, metadata), dtype=torch.float32)
            if scores.shape != (images.shape[0],):
                raise ValueError(
                    f"reward {model.name!r} returned shape {tuple(scores.shape)}, "
                    f"expected ({images.shape[0]},)"
                )
            self.last_components[model.name] = scores
            total = total + weight * scores
        return total


def build_weighted_reward(specs: list[dict[str, Any]]) -> WeightedReward:
    """specs: params.yaml `rewards` list, each {name, weight=1.0, **backend kwargs}."""
    components = []
    for spec in specs:
        spec = dict(spec)
        name = spec.pop("name")
        weight = float(spec.pop("weight", 1.0))
        components.append((build_reward(name, **spec), weight))
    return WeightedReward(components)


def _import_builtin_backends() -> None:
    # Registration modules are light: each backend imports its heavy package lazily,
    # inside its factory.
    import margrpo.rewards.registry  # noqa: F401

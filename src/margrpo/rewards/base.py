"""One reward interface for every scorer, built by name from the reward table.

A reward maps a batch of images with their prompts and prompt metadata to one float per
image, higher is better:

    images:   float tensor [B, 3, H, W], RGB in [0, 1]
    prompts:  list of B strings
    metadata: list of B dicts in the prompt JSONL schema (see margrpo.world.prompts)
    returns:  float tensor [B]

`build_reward(name, **kwargs)` looks the name up in margrpo.rewards.table (name ->
"module:factory"), imports that module then, and calls the factory with the keyword
arguments of the entry in params.yaml (`rewards: [{name, weight, ...}]`). Heavy backends
import their packages inside the factory, so building one never imports the others.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, runtime_checkable

import torch

from margrpo.rewards.table import REWARDS, Backend


@runtime_checkable
class RewardModel(Protocol):
    name: str

    def __call__(
        self, images: torch.Tensor, prompts: list[str], metadata: list[dict[str, Any]]
    ) -> torch.Tensor: ...


RewardFactory = Callable[..., RewardModel]


def register_reward(name: str) -> Callable[[RewardFactory], RewardFactory]:
    """Decorator for plugins (tests, out-of-tree scorers): add `name` -> this factory to the
    reward table, taking any keyword arguments. Built-in backends are rows of the table."""

    def deco(factory: RewardFactory) -> RewardFactory:
        if name in REWARDS:
            raise ValueError(f"reward {name!r} is already in the table ({REWARDS[name].target})")
        REWARDS[name] = Backend(factory)
        return factory

    return deco


def resolve(target: str | RewardFactory) -> RewardFactory:
    """The factory of a table entry: "module:qualname" is imported now."""
    if callable(target):
        return target
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def build_reward(name: str, **kwargs: Any) -> RewardModel:
    if name not in REWARDS:
        raise ValueError(
            f"unknown reward {name!r}; available: {', '.join(sorted(REWARDS))}. "
            "Set rewards[].name in params.yaml to one of these."
        )
    return resolve(REWARDS[name].target)(**kwargs)


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


"""The reward table: params.yaml `rewards[].name` -> "module:factory", imported only when built.

Nothing is imported here, so params.yaml validation (margrpo.config) checks reward names
and keys against this table in milliseconds, without torch or any backend package. A
factory's module is imported by `margrpo.rewards.base.build_reward` when the reward is
built. Plugins (tests, out-of-tree scorers) add rows with `base.register_reward`.

`args` lists the keyword arguments a factory takes besides `name` and `weight` (key ->
allowed values, or None for any value); None for the whole mapping means any keyword
(plugins, and `remote`, whose extra keys go to the backend in the server process).
tests/test_rewards_table.py checks every row against its factory's signature.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Backend(NamedTuple):
    # "package.module:callable", imported when built; a plugin registered at run time
    # (base.register_reward) holds its factory itself.
    target: str | Callable[..., Any]
    args: dict[str, Any] | None = None       # keyword -> allowed values (None: any value)


# How the world reward combines the evaluator's scores (margrpo.world.reward).
WORLD_MODES = ("aligned", "partial", "geneval", "t2i", "mix")
# Keys of the remote client (margrpo.rewards.remote); every other key goes to the backend.
CLIENT_KEYS = ("python", "url", "workdir", "startup_timeout", "request_timeout",
               "keep_batches", "plugins", "pythonpath")

_DEVICE = {"batch_size": None, "device": None, "dtype": None}
_CLIENT = dict.fromkeys(CLIENT_KEYS)

REWARDS: dict[str, Backend] = {
    "world": Backend("margrpo.world.reward:WorldReward", {"mode": WORLD_MODES, "image_size": None}),
    # the learning ladder's dense single-attribute reward (docs/learning.md)
    "world_colour": Backend("margrpo.world.colour_reward:ColourShareReward", {"temperature": None}),
    "clipscore": Backend("margrpo.rewards.clipscore:CLIPScoreReward",
                         {"model_path": None, "processor_path": None, "weight_w": None, **_DEVICE}),
    "pickscore": Backend("margrpo.rewards.pickscore:PickScoreReward",
                         {"model_path": None, "processor_path": None, **_DEVICE}),
    "aesthetic": Backend("margrpo.rewards.aesthetic:AestheticReward",
                         {"clip_path": None, "head_path": None, "processor_path": None, **_DEVICE}),
    "hpsv2": Backend("margrpo.rewards.hps:build",
                     {"checkpoint": None, "model_name": None, "model_config": None, **_DEVICE, **_CLIENT}),
    "imagereward": Backend("margrpo.rewards.imagereward:build",
                           {"checkpoint": None, "med_config": None, "bert_tokenizer": None, **_DEVICE, **_CLIENT}),
    "vqascore": Backend("margrpo.rewards.vqascore:build",
                        {"model_path": None, "tokenizer_path": None, "vision_tower_path": None,
                         "conversation": None, "batch_size": None, "device": None, **_CLIENT}),
    "remote": Backend("margrpo.rewards.remote:build"),
}


def check_spec(spec: dict[str, Any]) -> list[str]:
    """Problems of one params.yaml rewards entry {name, weight, **kwargs}, as "key: problem"
    lines (empty when it is fine). Reads only this table."""
    name = spec.get("name")
    if name not in REWARDS:
        return [f"name: unknown reward {name!r}; rewards: {', '.join(sorted(REWARDS))}"]
    args = REWARDS[name].args
    if args is None:
        return []
    problems = []
    for key, value in spec.items():
        if key in ("name", "weight"):
            continue
        if key not in args:
            problems.append(f"{key}: unknown key for reward {name!r}; its keys: {', '.join(args)}")
        elif args[key] is not None and value not in args[key]:
            problems.append(f"{key}: {value!r} is not one of {', '.join(map(str, args[key]))}")
    return problems

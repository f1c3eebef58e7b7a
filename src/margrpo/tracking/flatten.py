"""Flatten nested params into MLflow's flat key -> string params."""
from __future__ import annotations

import json
from typing import Any

# MLflow caps a param value at 6000 characters; a longer one is kept as JSON, truncated.
_MAX_VALUE = 6000


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{'train': {'lr': 1e-4}, 'rewards': [{'name': 'world'}]} ->
    {'train.lr': '0.0001', 'rewards.0.name': 'world'}. Lists of scalars stay one value
    ('train.seeds': '[0, 1, 2]') so that a run's seed list reads as it does in params.yaml."""
    out: dict[str, str] = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(tree, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in tree):
        for i, value in enumerate(tree):
            out.update(flatten(value, f"{prefix}{i}."))
    else:
        value = json.dumps(list(tree)) if isinstance(tree, (list, tuple)) else str(tree)
        out[prefix.rstrip(".")] = value[:_MAX_VALUE]
    return out

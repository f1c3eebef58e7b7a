"""Checks and reads of a published model folder, before anything heavy is built.

`require_layout` names every missing file at once; `check_tensors` compares the tensor
names and shapes stored in safetensors headers (read without loading the weights) with the
ones the adapter builds, and names the file, the first differences and the expected layout.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file


class WeightsError(FileNotFoundError):
    """A published model folder is missing files or does not match the adapter."""


def weight_files(folder: Path, stem: str) -> list[Path]:
    """The safetensors file(s) `stem`.safetensors, or the shards its index lists."""
    single, index = folder / f"{stem}.safetensors", folder / f"{stem}.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    return []


def require_layout(root: Path, kind: str, layout: dict[str, str]) -> None:
    """layout: relative path -> what it holds. A path ending in '.safetensors' may also be
    present as '<stem>.safetensors.index.json' with its shards."""
    if not root.is_dir():
        raise WeightsError(f"model.weights={str(root)!r} is not a folder; expected the published {kind} folder:\n"
                           + _describe(layout))
    missing = []
    for rel, _ in layout.items():
        p = root / rel
        if rel.endswith(".safetensors"):
            if not weight_files(p.parent, p.name[: -len(".safetensors")]):
                missing.append(rel)
        elif not p.exists():
            missing.append(rel)
    if missing:
        raise WeightsError(f"{kind} weights at {root} are incomplete: missing {', '.join(missing)}. "
                           f"Expected the published {kind} layout:\n" + _describe(layout))


def _describe(layout: dict[str, str]) -> str:
    return "\n".join(f"  {rel:<48} {what}" for rel, what in layout.items())


def stored_shapes(files: list[Path]) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            for k in h.keys():
                shapes[k] = list(h.get_slice(k).get_shape())
    return shapes


def check_tensors(files: list[Path], expected: dict[str, list[int]], what: str, ignore_prefixes=()) -> None:
    """Raise WeightsError unless the stored tensors are exactly `expected` (name -> shape)."""
    stored = {k: v for k, v in stored_shapes(files).items() if not k.startswith(tuple(ignore_prefixes))}
    missing = sorted(set(expected) - set(stored))
    extra = sorted(set(stored) - set(expected))
    wrong = sorted(k for k in set(stored) & set(expected) if stored[k] != expected[k])
    if missing or extra or wrong:
        lines = [f"{', '.join(str(f) for f in files)} does not match the {what} this config builds:"]
        if missing:
            lines.append(f"  missing {len(missing)} tensors, e.g. {missing[:3]}")
        if extra:
            lines.append(f"  {len(extra)} unexpected tensors, e.g. {extra[:3]}")
        for k in wrong[:3]:
            lines.append(f"  {k}: stored {stored[k]}, expected {expected[k]}")
        lines.append("Use the published checkpoint with its own config.json (same names and shapes), "
                     "or fix the config next to the weights.")
        raise WeightsError("\n".join(lines))


def load_tensors(files: list[Path], prefix: str = "") -> dict[str, torch.Tensor]:
    """All tensors of `files` whose name starts with prefix, with the prefix removed."""
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update({k[len(prefix):]: v for k, v in load_file(str(f)).items() if k.startswith(prefix)})
    return out


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise WeightsError(f"{path} is not valid JSON ({err})") from None

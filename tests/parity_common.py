"""Shared by tests/parity_nova.py and tests/parity_harmon.py, the two halves of
probes/official_parity.py (adapter vs official code): replayed noise, manifests, diffs."""
from __future__ import annotations

import datetime
import json
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parent / "data"


class ReplayedNoise:
    """The adapter's noise source, fed with the official run's order and per-step noise.

    order: [B, N] commit order; step_noise(i, idx) -> [T+1, B, n, D] for positions idx."""

    def __init__(self, order, step_noise):
        self._order, self._step_noise = order, step_noise

    def order(self, seeds, num_tokens):
        return self._order

    def step(self, seeds, step, num_steps, n, m, d):
        return self._step_noise(step), None


def write_manifest(name: str, config: dict, module: torch.nn.Module, source: str) -> dict:
    tensors = {k: list(v.shape) for k, v in module.state_dict().items()}
    out = {"model": name, "source": source, "date": datetime.date.today().isoformat(), "config": config,
           "num_tensors": len(tensors), "num_elements": int(sum(torch.Size(s).numel() for s in tensors.values())),
           "tensors": tensors}
    DATA.mkdir(parents=True, exist_ok=True)
    (DATA / f"{name}_manifest.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def max_diff(a, b) -> float:
    return float((a.detach().float() - b.detach().float()).abs().max())

"""Reward "world_colour": a dense, differentiable single-attribute reward for the learning
ladder's first rung (docs/learning.md): the share of an image's ink in the
colours its prompt names.

Each pixel is softly assigned to the world's palette (every colour in its plain and its
striped-dark shade) or to the white background, by softmax(-|rgb - entry|^2 / temperature).
Ink is 1 - p(background). For a prompt that names colours (its metadata's `include[].color`)
the reward is sum_px p(a named colour) / (sum_px ink + 1): 1 for an image drawn all in the
named colours, 0 for one in other colours, and the +1 px keeps an empty canvas at 0. For a
prompt that names none it is the share of the single most used colour (an object painted
patch by patch in several colours scores low). Differentiable in the pixels, so that the
exact (pathwise) gradient of its expectation exists (margrpo.probes.pathwise).
"""
from __future__ import annotations

import torch

from margrpo.world.grammar import COLORS
from margrpo.world.render import STRIPE_DARKNESS

NAMES = tuple(COLORS)


class ColourShareReward:
    name = "world_colour"

    def __init__(self, temperature: float = 0.01):
        if temperature <= 0:
            raise ValueError(f"rewards[world_colour].temperature must be > 0, got {temperature}")
        plain = torch.tensor([COLORS[c] for c in NAMES])  # [C, 3]
        # palette entries: C plain, C dark (stripes), then white: [2C + 1, 3]
        self.entries = torch.cat([plain, plain * STRIPE_DARKNESS, torch.ones(1, 3)])
        self.temperature = float(temperature)

    def colour_mass(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """images [B, 3, H, W] in [0, 1] -> (per-colour soft pixel counts [B, C], ink [B])."""
        px = images.float().flatten(2).transpose(1, 2)  # [B, P, 3]
        d2 = (px.unsqueeze(2) - self.entries.to(px.device)).pow(2).sum(-1)  # [B, P, 2C + 1]
        p = torch.softmax(-d2 / self.temperature, dim=-1)
        c = len(NAMES)
        mass = (p[..., :c] + p[..., c : 2 * c]).sum(1)  # [B, C]
        return mass, (1.0 - p[..., -1]).sum(1)

    def __call__(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> torch.Tensor:
        if len(metadata) != images.shape[0]:
            raise ValueError(f"reward world_colour needs one metadata dict per image: "
                             f"{images.shape[0]} images, {len(metadata)} metadata rows")
        mass, ink = self.colour_mass(images)
        named = torch.zeros(mass.shape, dtype=torch.bool, device=mass.device)
        for b, meta in enumerate(metadata):
            for obj in meta.get("include", []):
                if obj.get("color"):
                    named[b, NAMES.index(obj["color"])] = True
        wanted = torch.where(named.any(1), (mass * named).sum(1), mass.max(1).values)
        return wanted / (ink + 1.0)

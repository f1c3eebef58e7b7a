"""The MAR diffusion head: an MLP with AdaLN conditioning on the AR latent z and time t.

Same role and shape as MAR's SimpleMLPAdaLN: per token, it maps a noisy token x_t [R, D],
the head time input t [R] (in [0, 1]) and the transformer's conditioning vector z [R, C]
to the sampler's regression target (epsilon for DDPM, velocity for the flow SDE).
Tokens are independent rows, so the head is cheap next to the transformer.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled to 0..1000 like integer DDPM steps)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (t.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1.0 + scale) + shift


class AdaLNResBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.modulated(h, self.ada(c))

    def modulated(self, h: torch.Tensor, ada: torch.Tensor) -> torch.Tensor:
        """The block given its AdaLN output ada = self.ada(c) [R, 3W]; h: [..., R, W], whose
        leading dims (several chains of one token) share it."""
        shift, scale, gate = ada.chunk(3, dim=-1)
        return h + gate * self.mlp(modulate(self.norm(h), shift, scale))


class DiffusionHead(nn.Module):
    def __init__(self, token_dim: int, cond_dim: int, width: int, depth: int):
        super().__init__()
        self.time_dim = width
        self.time_mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.cond_proj = nn.Linear(cond_dim, width)
        self.in_proj = nn.Linear(token_dim, width)
        self.blocks = nn.ModuleList(AdaLNResBlock(width) for _ in range(depth))
        self.final_norm = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))
        self.out_proj = nn.Linear(width, token_dim)
        self._init_weights()

    def _init_weights(self) -> None:
        # AdaLN-zero: every block starts as the identity and the output as 0, as in DiT/MAR.
        for blk in self.blocks:
            nn.init.zeros_(blk.ada[-1].weight)
            nn.init.zeros_(blk.ada[-1].bias)
        nn.init.zeros_(self.final_ada[-1].weight)
        nn.init.zeros_(self.final_ada[-1].bias)
        nn.init.zeros_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """x: [R, D], t: [R], z: [R, C] -> [R, D]."""
        return self.apply_condition(x, self.condition(t, z))

    def condition(self, t: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The part of the forward that reads only (t, z): every block's AdaLN output
        [R, 3W], then the final one [R, 2W]. About two thirds of the head's multiply-adds,
        so chains that share a token's z and t (several chains of one token) compute it once."""
        c = self.time_mlp(timestep_embedding(t, self.time_dim)) + self.cond_proj(z)
        return tuple(blk.ada(c) for blk in self.blocks) + (self.final_ada(c),)

    def apply_condition(self, x: torch.Tensor, cond: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The rest of the forward: x [..., R, D] (any leading dims share `cond`) -> [..., R, D]."""
        h = self.in_proj(x)
        for blk, ada in zip(self.blocks, cond):
            h = blk.modulated(h, ada)
        shift, scale = cond[-1].chunk(2, dim=-1)
        return self.out_proj(modulate(self.final_norm(h), shift, scale))

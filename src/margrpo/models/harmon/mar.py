"""Harmon's MAR encoder/decoder and its diffusion MLP head, with the published names.

Written from a reading of wusize/Harmon (src/models/mar/mar.py, diffloss.py; MAR-H:
encoder and decoder of 20 blocks at width 1280, head of 12 AdaLN blocks at width 1536).
Blocks are timm ViT blocks (pre-LN, `norm1 / attn.qkv / attn.proj / norm2 / mlp.fc1 /
mlp.fc2`). Harmon feeds the MAR encoder's output through Qwen2 (see policy.py) between
the MAR encoder and decoder.

A sequence is [64 buffer rows ; N image rows]. The buffer rows carry `fake_latent` (the
same for the prompted and the null branch; the prompt enters through the LLM). Position
embeddings are learned at the training grid (16 x 16 for img_size 256) and bilinearly
resized for other grids (32 x 32 at 512 px).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from margrpo.models.nova.transformer import Attention  # same qkv / proj layout as timm's

# Published MAR sizes (encoder = decoder): name -> (width, depth, heads).
MAR_SIZES = {"mar_base": (768, 12, 12), "mar_large": (1024, 16, 16), "mar_huge": (1280, 20, 16)}


class Mlp(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block (timm's ViT Block without layer scale or drop path)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width, eps=1e-6), nn.LayerNorm(width, eps=1e-6)
        self.attn = Attention(width, heads)
        self.mlp = Mlp(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def resize_grid(pe: torch.Tensor, grid: int, size: tuple[int, int]) -> torch.Tensor:
    """pe [1, grid*grid, C] learned on a grid x grid layout -> [1, h*w, C] (bilinear)."""
    if size == (grid, grid):
        return pe
    img = pe.view(1, grid, grid, -1).permute(0, 3, 1, 2)
    img = F.interpolate(img, size=size, mode="bilinear")
    return img.permute(0, 2, 3, 1).reshape(1, size[0] * size[1], -1)


class MAR(nn.Module):
    """`mar.*` of a Harmon checkpoint. tokens: [B, N, token_dim] VAE latents (x vae_scale)."""

    def __init__(self, width: int, depth: int, heads: int, token_dim: int = 16, img_size: int = 256,
                 vae_stride: int = 16, buffer_size: int = 64, class_num: int = 1000,
                 diffloss_d: int = 12, diffloss_w: int = 1536):
        super().__init__()
        self.grid = img_size // vae_stride
        self.buffer_size = buffer_size
        seq = self.grid * self.grid
        self.class_emb = nn.Embedding(class_num, width)  # unused by Harmon, kept for the layout
        self.fake_latent = nn.Parameter(torch.zeros(1, width))
        self.z_proj = nn.Linear(token_dim, width)
        self.z_proj_ln = nn.LayerNorm(width, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq + buffer_size, width))
        self.encoder_blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.encoder_norm = nn.LayerNorm(width, eps=1e-6)
        self.decoder_embed = nn.Linear(width, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, seq + buffer_size, width))
        self.decoder_blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.decoder_norm = nn.LayerNorm(width, eps=1e-6)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, seq, width))
        self.diffloss = nn.Module()
        self.diffloss.net = DiffusionMLP(token_dim, diffloss_w, 2 * token_dim, width, diffloss_d)
        for p in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                  self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(p, std=0.02)  # as MAR initialises them (checkpoints overwrite)

    def _pos(self, pe: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        buf, img = pe.split([self.buffer_size, pe.shape[1] - self.buffer_size], dim=1)
        return torch.cat([buf, resize_grid(img, self.grid, size)], dim=1)

    def encode(self, tokens: torch.Tensor, known_idx: torch.Tensor, size: tuple[int, int], run) -> torch.Tensor:
        """MAE encoder over [buffer ; known tokens in position order] -> [B, buf + k, W]."""
        b, buf = tokens.shape[0], self.buffer_size
        pos = self._pos(self.encoder_pos_embed_learned, size)  # [1, buf + N, W]
        rows = known_idx.unsqueeze(-1)
        x = self.z_proj(tokens.gather(1, rows.expand(-1, -1, tokens.shape[-1])))
        x = x + pos[:, buf:].expand(b, -1, -1).gather(1, rows.expand(-1, -1, x.shape[-1]))
        head = (self.fake_latent + pos[:, :buf]).expand(b, -1, -1)
        x = self.z_proj_ln(torch.cat([head, x], dim=1))
        for blk in self.encoder_blocks:
            x = run(blk, x)
        return self.encoder_norm(x)

    def decode(self, x: torch.Tensor, known_idx: torch.Tensor, size: tuple[int, int], run) -> torch.Tensor:
        """MAE decoder: encoder rows back in place, mask_token elsewhere -> z [B, N, W]."""
        b, buf, n = x.shape[0], self.buffer_size, size[0] * size[1]
        x = self.decoder_embed(x)
        full = self.mask_token.to(x.dtype).expand(b, buf + n, -1)
        rows = torch.cat([torch.arange(buf, device=known_idx.device).expand(b, -1), known_idx + buf], dim=1).unsqueeze(-1)
        full = full.scatter(1, rows.expand(-1, -1, x.shape[-1]), x)
        h = full + self._pos(self.decoder_pos_embed_learned, size)
        for blk in self.decoder_blocks:
            h = run(blk, h)
        h = self.decoder_norm(h)[:, buf:]
        return h + resize_grid(self.diffusion_pos_embed_learned, self.grid, size)


def timestep_freqs(dim: int) -> torch.Tensor:
    """The dim // 2 frequencies of `timestep_embedding` [dim // 2], as in DiT."""
    half = dim // 2
    return torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)


def timestep_embedding(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Sinusoidal embedding [R, 2F] of integer timesteps t [R] at freqs [F] (cos first)."""
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class AdaLNBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.in_ln = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 3 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale, gate = self.adaLN_modulation(y).chunk(3, dim=-1)
        return x + gate * self.mlp(self.in_ln(x) * (1 + scale) + shift)


class FinalLayer(nn.Module):
    def __init__(self, width: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(width, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 2 * width))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(y).chunk(2, dim=-1)
        return self.linear(self.norm_final(x) * (1 + scale) + shift)


class DiffusionMLP(nn.Module):
    """MAR's SimpleMLPAdaLN: x [R, D], integer timestep [R], z [R, C] -> [R, 2D]
    (epsilon, then the learned-variance interpolation values in [-1, 1])."""

    def __init__(self, in_dim: int, width: int, out_dim: int, z_dim: int, depth: int):
        super().__init__()
        self.time_embed = nn.Module()
        self.time_embed.mlp = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))
        # Constant table moved with the module (the head runs T times per AR step); not in
        # the published state dict.
        self.register_buffer("freqs", timestep_freqs(256), persistent=False)
        self.cond_embed = nn.Linear(z_dim, width)
        self.input_proj = nn.Linear(in_dim, width)
        self.res_blocks = nn.ModuleList(AdaLNBlock(width) for _ in range(depth))
        self.final_layer = FinalLayer(width, out_dim)

    def forward(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = self.input_proj(x)
        y = self.time_embed.mlp(timestep_embedding(t, self.freqs).to(h.dtype)) + self.cond_embed(z)
        for blk in self.res_blocks:
            h = blk(h, y)
        return self.final_layer(h, y)

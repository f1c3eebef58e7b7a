"""Harmon's KL-16 VAE (LDM's KL autoencoder layout), decoder path only.

Written from a reading of wusize/Harmon src/models/mar/vae.py: same module names and
shapes (`vae.encoder.down.{i}.block.{j}...`, `vae.decoder.up.{i}...`, `quant_conv`,
`post_quant_conv`), so the published weights load as they are. Generation only decodes;
the encoder is built so that the checkpoint's encoder tensors have a home (strict loading).
Latents: 16 channels at stride 16 (5 levels, 4 downsamplings).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def group_norm(ch: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, ch, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = group_norm(cin), nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2, self.conv2 = group_norm(cout), nn.Conv2d(cout, cout, 3, 1, 1)
        self.dropout = nn.Dropout(0.0)
        if cin != cout:
            self.nin_shortcut = nn.Conv2d(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the h*w positions, 1x1-conv projections."""

    def __init__(self, ch: int):
        super().__init__()
        self.norm = group_norm(ch)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (f(n).reshape(b, c, h * w) for f in (self.q, self.k, self.v))
        a = torch.softmax(torch.bmm(q.transpose(1, 2), k) * c**-0.5, dim=2)  # [b, hw_q, hw_k]
        return x + self.proj_out(torch.bmm(v, a.transpose(1, 2)).reshape(b, c, h, w))


class Resample(nn.Module):
    def __init__(self, ch: int, down: bool):
        super().__init__()
        self.down = down
        self.conv = nn.Conv2d(ch, ch, 3, 2 if down else 1, 0 if down else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.down:
            return self.conv(F.pad(x, (0, 1, 0, 1)))
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _level(blocks: list[nn.Module], attn: list[nn.Module]) -> nn.Module:
    m = nn.Module()
    m.block, m.attn = nn.ModuleList(blocks), nn.ModuleList(attn)
    return m


def _mid(ch: int) -> nn.Module:
    m = nn.Module()
    m.block_1, m.attn_1, m.block_2 = ResnetBlock(ch, ch), AttnBlock(ch), ResnetBlock(ch, ch)
    return m


class Encoder(nn.Module):
    def __init__(self, ch: int, ch_mult, z_channels: int, num_res_blocks: int = 2, resolution: int = 256,
                 attn_resolutions=(16,)):
        super().__init__()
        self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)
        self.down = nn.ModuleList()
        cin, res = ch, resolution
        for i, mult in enumerate(ch_mult):
            blocks, attn = [], []
            for _ in range(num_res_blocks):
                blocks.append(ResnetBlock(cin, ch * mult))
                cin = ch * mult
                if res in attn_resolutions:
                    attn.append(AttnBlock(cin))
            level = _level(blocks, attn)
            if i != len(ch_mult) - 1:
                level.downsample = Resample(cin, down=True)
                res //= 2
            self.down.append(level)
        self.mid = _mid(cin)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, 2 * z_channels, 3, 1, 1)


class Decoder(nn.Module):
    def __init__(self, ch: int, ch_mult, z_channels: int, num_res_blocks: int = 2):
        super().__init__()
        cin = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, cin, 3, 1, 1)
        self.mid = _mid(cin)
        levels = []
        for i in reversed(range(len(ch_mult))):
            blocks = []
            for _ in range(num_res_blocks + 1):
                blocks.append(ResnetBlock(cin, ch * ch_mult[i]))
                cin = ch * ch_mult[i]
            level = _level(blocks, [])
            if i != 0:
                level.upsample = Resample(cin, down=False)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)
        self.norm_out = group_norm(cin)
        self.conv_out = nn.Conv2d(cin, 3, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for i in reversed(range(len(self.up))):
            for blk in self.up[i].block:
                h = blk(h)
            if i != 0:
                h = self.up[i].upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class KLVAE(nn.Module):
    """embed_dim latent channels; ch_mult (1, 1, 2, 2, 4) and ch 128 in Harmon."""

    def __init__(self, embed_dim: int = 16, ch_mult=(1, 1, 2, 2, 4), ch: int = 128):
        super().__init__()
        self.embed_dim = embed_dim
        self.encoder = Encoder(ch, ch_mult, embed_dim)
        self.decoder = Decoder(ch, ch_mult, embed_dim)
        self.quant_conv = nn.Conv2d(2 * embed_dim, 2 * embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, embed_dim, 1)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """[B, embed_dim, h, w] -> images [B, 3, 16h, 16w] in about [-1, 1]."""
        return self.decoder(self.post_quant_conv(z))

"""NOVA's text-to-image transformer, with the published checkpoint's parameter names.

Written from a reading of baaivision/NOVA (diffnext/models): the same modules under the
same names and shapes, so `transformer/diffusion_pytorch_model.safetensors` of a published
NOVA folder loads as it is. Only the text-to-image path is implemented (one frame).

Structure (d48w1024: 16 + 32 transformer blocks of width 1024, a 3-block MLP head):
- text_embed: LayerNorm(Linear(text states [B, L, 2560])) -> [B, L, W]; rows past a
  prompt's length are the learned buffer `weight` (also the whole null prompt).
- video_encoder: 16 blocks over [text ; bos tokens of the first frame] -> c [B, Nv, W].
- image_encoder: MAE-style: the first half of its blocks reads [c ; known tokens], the
  second half [c ; all tokens, masked ones as mask_token]; output z [B, N, W].
- image_decoder: the diffusion MLP (AdaLN on z + time), velocity prediction per token.
Blocks apply LayerNorm to each branch's output (x + norm(attn(x)), x + norm(mlp(x))).

Tokens: the VAE latent [C, H, W] cut into p x p patches, flattened as (py, px, c), row-major
over the patch grid: NOVA's `patchify`. Patch embeddings are convolutions with stride p in
the checkpoint; on tokens they are the same linear map (`patch_linear`).
"""
from __future__ import annotations

import math
import re

import torch
from torch import nn
from torch.nn import functional as F

# Published architecture names -> (depth, width, heads) (diffnext transformer_nova.py).
ENCODERS = {
    "vit_d16w768": (16, 768, 12), "vit_d16w1024": (16, 1024, 16), "vit_d16w1536": (16, 1536, 16),
    "vit_d32w768": (32, 768, 12), "vit_d32w1024": (32, 1024, 16), "vit_d32w1536": (32, 1536, 16),
}
DECODERS = {"mlp_d3w1280": (3, 1280), "mlp_d6w768": (6, 768), "mlp_d6w1024": (6, 1024), "mlp_d6w1536": (6, 1536)}


def parse_arch(name: str, decoder: bool = False) -> tuple[int, ...]:
    """A published name, or 'vit_d{depth}w{width}h{heads}' / 'mlp_d{depth}w{width}' for
    reduced test configs."""
    table = DECODERS if decoder else ENCODERS
    if name in table:
        return table[name]
    pat = r"mlp_d(\d+)w(\d+)" if decoder else r"vit_d(\d+)w(\d+)h(\d+)"
    m = re.fullmatch(pat, name)
    if not m:
        raise ValueError(f"unknown NOVA arch {name!r}; published: {sorted(table)}, or {pat} for a custom size")
    return tuple(int(g) for g in m.groups())


def patch_linear(conv: nn.Conv2d, tokens: torch.Tensor) -> torch.Tensor:
    """A stride-p convolution applied to (py, px, c)-flattened patch tokens [..., p*p*C]."""
    w = conv.weight.permute(0, 2, 3, 1).reshape(conv.out_channels, -1)
    return F.linear(tokens, w, conv.bias)


def sincos_2d(dim: int, h: int, w: int) -> torch.Tensor:
    """NOVA's fixed 2D position embedding [h*w, dim]: (sin, cos) of x then of y."""
    freq = 1.0 / (10000 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4)))
    gy, gx = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    fx, fy = gx.reshape(-1, 1) * freq, gy.reshape(-1, 1) * freq
    return torch.cat([fx.sin(), fx.cos(), fy.sin(), fy.cos()], dim=-1)


def timestep_freqs(dim: int) -> torch.Tensor:
    """The dim // 2 frequencies of `freq_embed` [dim // 2] (on the current default device)."""
    return torch.exp(torch.arange(dim // 2, dtype=torch.float32) * (-math.log(10000.0) / (dim // 2)))


def freq_embed(t: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """Sinusoidal embedding [R, 2F] of timesteps t [R] (0..1000 scale) at frequencies freq
    [F] (timestep_freqs), cos first."""
    arg = t.float().unsqueeze(-1) * freq
    return torch.cat([arg.cos(), arg.sin()], dim=-1)


class PatchEmbed(nn.Module):
    def __init__(self, in_dim: int, width: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_dim, width, patch, patch)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))


class MLP(nn.Module):
    """fc2(GELU(fc1(x))) with a 4x hidden width: the transformer blocks' MLP."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)
        self.activation = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class Projector(nn.Module):
    """fc2(SiLU(fc1(x))): the head's MLPs."""

    def __init__(self, dim: int, hidden: int, out: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, out)
        self.activation = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class Block(nn.Module):
    """x + LN(attn(x)), then x + LN(mlp(x)): NOVA normalises each branch's output."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.norm1(self.attn(x))
        return x + self.norm2(self.mlp(x))


class VisionTransformer(nn.Module):
    def __init__(self, depth: int, width: int, heads: int, patch: int, latent_dim: int):
        super().__init__()
        self.width = width
        self.patch_embed = PatchEmbed(latent_dim, width, patch)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)


class AdaLNZero(nn.Module):
    """LN(x) (1 + scale) + shift, with (scale, shift, *gates) = Linear(SiLU(z))."""

    def __init__(self, width: int, num_stats: int):
        super().__init__()
        self.proj = nn.Linear(width, num_stats * width)
        self.num_stats = num_stats

    def forward(self, x: torch.Tensor, z: torch.Tensor):
        stats = self.proj(F.silu(z)).chunk(self.num_stats, dim=-1)
        return F.layer_norm(x, x.shape[-1:], eps=1e-6) * (1 + stats[0]) + stats[1], stats[2:]


class DiffusionBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm1 = AdaLNZero(width, 3)
        self.proj = Projector(width, width, width)
        self.norm2 = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h, (gate,) = self.norm1(x, z)
        return self.norm2(self.proj(h)) * gate + x


class TimeCondEmbed(nn.Module):
    def __init__(self, cond_dim: int, width: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        # Constant table, kept with the module's parameters (moved by .to) so the head's
        # T steps per AR step build nothing on the host; not in the published state dict.
        self.register_buffer("freqs", timestep_freqs(freq_dim), persistent=False)
        self.timestep_proj = Projector(freq_dim, width, width)
        self.condition_proj = Projector(cond_dim, width, width)


class DiffusionMLP(nn.Module):
    """The head: x [R, p*p*C], timestep [R] (0..1000), z [R, C_z] -> velocity [R, p*p*C]."""

    def __init__(self, depth: int, width: int, cond_dim: int, patch: int, latent_dim: int):
        super().__init__()
        self.patch_embed = PatchEmbed(latent_dim, width, patch)
        self.time_cond_embed = TimeCondEmbed(cond_dim, width)
        self.blocks = nn.ModuleList(DiffusionBlock(width) for _ in range(depth))
        self.norm = AdaLNZero(width, 2)
        self.head = nn.Linear(width, patch * patch * latent_dim)

    def forward(self, x: torch.Tensor, timestep: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        tc = self.time_cond_embed
        temb = tc.timestep_proj(freq_embed(timestep, tc.freqs).to(z.dtype))
        z = tc.condition_proj(z) + temb
        h = patch_linear(self.patch_embed.proj, x)
        for blk in self.blocks:
            h = blk(h, z)
        return self.head(self.norm(h, z)[0])


class TextEmbed(nn.Module):
    def __init__(self, text_dim: int, width: int, num_tokens: int):
        super().__init__()
        self.num_tokens = num_tokens
        self.proj, self.norm = nn.Linear(text_dim, width), nn.LayerNorm(width)
        # Learned filler for text positions past a prompt's end (512 = the checkpoint's size).
        self.register_buffer("weight", torch.zeros(512, text_dim))


class MaskEmbed(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.bos_token = nn.Parameter(torch.zeros(1, width))
        self.mask_token = nn.Parameter(torch.zeros(1, width))


class VideoPosEmbed(nn.Module):
    """Absolute position embedding of the frame tokens: a learned time embedding of frame 0
    plus the fixed 2D sin-cos grid."""

    def __init__(self, width: int, grid: tuple[int, int]):
        super().__init__()
        self.grid = grid
        self.time_proj = nn.Sequential(nn.Linear(256, width), nn.SiLU(), nn.Linear(width, width))
        self.norm = nn.LayerNorm(width)
        # sin(0) = 0, cos(0) = 1 over 128 frequencies: frame 0's time features [1, 256].
        self.register_buffer("frame0_features", torch.cat([torch.zeros(1, 128), torch.ones(1, 128)], dim=-1),
                             persistent=False)

    def frame0(self) -> torch.Tensor:
        """Time embedding of frame 0 [1, W]."""
        return self.norm(self.time_proj(self.frame0_features.to(self.norm.weight)))


class NOVATransformer(nn.Module):
    """The `transformer` component of a NOVA folder (its config.json keys as arguments)."""

    def __init__(
        self,
        image_dim: int,
        image_size,
        image_stride: int,
        text_token_dim: int | None,
        text_token_len: int,
        image_base_size,
        video_base_size,
        arch,
        rotary_pos_embed: bool = False,
        video_mixer_rank: int | None = None,
        **_ignored,
    ):
        super().__init__()
        if not text_token_dim or rotary_pos_embed or video_mixer_rank or video_base_size[0] != 1:
            raise ValueError(
                "only NOVA's text-to-image configs are supported (text_token_dim set, "
                "rotary_pos_embed false, no video_mixer_rank, video_base_size[0] = 1)"
            )
        size = (image_size,) * 2 if isinstance(image_size, int) else tuple(image_size)
        self.latent_hw = tuple(v // image_stride for v in size)
        self.patch = 15 // image_stride + 1  # 2 for the stride-8 SD / SDXL VAEs
        self.image_base, self.video_base = tuple(image_base_size), tuple(video_base_size[1:])
        grid = tuple(v // self.patch for v in self.latent_hw)
        if grid != self.image_base or tuple(v // 2 for v in grid) != self.video_base:
            raise ValueError(f"image_base_size {self.image_base} / video_base_size {self.video_base} do not match "
                             f"the {grid} token grid of a {size} image at stride {image_stride}")
        vd, vw, vh = parse_arch(arch[0])
        idp, iw, ih = parse_arch(arch[1])
        dd, dw = parse_arch(arch[2], decoder=True)
        if vw != iw:
            raise ValueError(f"video and image encoder widths differ ({vw} vs {iw})")
        self.video_encoder = VisionTransformer(vd, vw, vh, 2 * self.patch, image_dim)
        self.image_encoder = VisionTransformer(idp, iw, ih, self.patch, image_dim)
        self.image_decoder = DiffusionMLP(dd, dw, iw, self.patch, image_dim)
        self.mask_embed = MaskEmbed(iw)
        self.text_embed = TextEmbed(text_token_dim, iw, text_token_len)
        self.video_pos_embed = VideoPosEmbed(vw, self.video_base)
        self.num_tokens = grid[0] * grid[1]
        self.token_dim = self.patch * self.patch * image_dim
        # Fixed 2D sin-cos position tables of the frame condition [Nv, W] and of the image
        # tokens [N, W], built once on the module's device and moved with it (non-persistent:
        # not in the published state dict).
        self.register_buffer("video_pos", sincos_2d(vw, *self.video_base), persistent=False)
        self.register_buffer("image_pos", sincos_2d(iw, *self.image_base), persistent=False)
        for t in (self.mask_embed.bos_token, self.mask_embed.mask_token, self.text_embed.weight):
            nn.init.normal_(t, std=0.02)  # as NOVA initialises them (checkpoints overwrite)

    def text_states(self, text: torch.Tensor) -> torch.Tensor:
        """Filled text-encoder states [B, L, Dt] -> [B, L, W]."""
        return self.text_embed.norm(self.text_embed.proj(text))

    def frame_condition(self, text: torch.Tensor, run=None) -> torch.Tensor:
        """The video encoder over [text ; bos tokens of frame 0] -> c [B, Nv, W]."""
        run = run or (lambda blk, x: blk(x))
        b = text.shape[0]
        pos = self.video_pos.to(text)
        c = (self.mask_embed.bos_token + self.video_pos_embed.frame0()) + pos
        x = torch.cat([text, c.expand(b, -1, -1)], dim=1)
        for blk in self.video_encoder.blocks:
            x = run(blk, x)
        return self.video_encoder.norm(x[:, text.shape[1] :])

    def image_latents(self, c: torch.Tensor, tokens: torch.Tensor, known_idx: torch.Tensor, run=None) -> torch.Tensor:
        """z [B, N, W] for canvas tokens [B, N, D] whose known positions are known_idx [B, k].

        The first half of the blocks reads [c ; known tokens], the second half [c ; every
        token] with the masked ones as mask_token (MAE encoder-decoder)."""
        run = run or (lambda blk, x: blk(x))
        enc = self.image_encoder
        x = patch_linear(enc.patch_embed.proj, tokens)
        known = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device).scatter_(1, known_idx, True)
        x = torch.where(known.unsqueeze(-1), x, self.mask_embed.mask_token.to(x))
        x = x + self.image_pos.to(x)
        rows = known_idx.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        h = torch.cat([c, x.gather(1, rows)], dim=1)
        half = len(enc.blocks) // 2
        for blk in enc.blocks[:half]:
            h = run(blk, h)
        c, hk = h.split([c.shape[1], h.shape[1] - c.shape[1]], dim=1)
        h = torch.cat([c, x.scatter(1, rows, hk)], dim=1)
        for blk in enc.blocks[half:]:
            h = run(blk, h)
        return enc.norm(h[:, c.shape[1] :])

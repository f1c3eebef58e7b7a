"""The MAR transformer: a bidirectional encoder over prompt tokens and a masked canvas.

Sequence = [prompt tokens (L) ; image tokens (N)]. Known image tokens enter through a
linear projection of their pixels, masked ones as a learned mask embedding; every position
has a learned position embedding. The output at image positions is the conditioning
vector z [B, N, C] of the diffusion head. A learned null prompt replaces the prompt
embeddings for the unconditional CFG branch (trained by prompt dropout).

Attention is written out with scaled_dot_product_attention rather than
nn.TransformerEncoderLayer, whose inference fast path computes differently from its
training path: the rollout (no grad) and the loss (grad) must give the same numbers.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        hidden = int(width * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, w = h.shape
        # The key bias adds q . b_k to every logit of a query, which softmax ignores: its
        # gradient is 0 in exact arithmetic and rounding noise in float, which AdamW (dividing
        # by the gradient's own scale) would turn into steps of up to lr that differ with the
        # batch split, the device or the number of processes (tests/test_distributed.py).
        # Detached, its gradient is the exact 0; the values, hence the output, are unchanged.
        bias = self.qkv.bias
        bias = torch.cat([bias[:w], bias[w : 2 * w].detach(), bias[2 * w :]])
        qkv = F.linear(self.norm1(h), self.qkv.weight, bias)
        q, k, v = qkv.view(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)  # [B, heads, S, w/heads], bidirectional
        h = h + self.proj(a.transpose(1, 2).reshape(b, s, w))
        return h + self.mlp(self.norm2(h))


class MAREncoder(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        max_prompt_len: int,
        num_tokens: int,
        token_dim: int,
        width: int,
        depth: int,
        heads: int,
        cond_dim: int,
    ):
        super().__init__()
        if width % heads:
            raise ValueError(f"transformer width {width} must be divisible by heads {heads}")
        self.word_emb = nn.Embedding(vocab_size, width)
        self.null_prompt = nn.Parameter(torch.zeros(max_prompt_len, width))
        self.prompt_pos = nn.Parameter(torch.zeros(max_prompt_len, width))
        self.token_proj = nn.Linear(token_dim, width)
        self.mask_emb = nn.Parameter(torch.zeros(width))
        self.image_pos = nn.Parameter(torch.zeros(num_tokens, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, cond_dim)
        for p in (self.null_prompt, self.prompt_pos, self.mask_emb, self.image_pos):
            nn.init.normal_(p, std=0.02)

    def forward(
        self,
        prompt_ids: torch.Tensor,
        canvas: torch.Tensor,
        known: torch.Tensor,
        null: torch.Tensor,
    ) -> torch.Tensor:
        """prompt_ids [B, L] long; canvas [B, N, D]; known [B, N] bool; null [B] bool
        (True: use the null prompt). Returns z [B, N, C]."""
        words = self.word_emb(prompt_ids)
        words = torch.where(null[:, None, None], self.null_prompt.expand_as(words), words)
        img = torch.where(known[..., None], self.token_proj(canvas), self.mask_emb.expand(*known.shape, -1))
        h = torch.cat([words + self.prompt_pos, img + self.image_pos], dim=1)
        for blk in self.blocks:
            h = blk(h)
        return self.out(self.norm(h[:, prompt_ids.shape[1]:]))

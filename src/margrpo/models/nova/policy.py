"""NOVA as a `MARPolicy`: the published text-to-image pipeline, one set of tokens per AR step.

Generation follows NOVA's pipeline (diffnext NOVAPipeline + Transformer3DModel): the
prompt and the empty prompt go through the Phi text encoder (positions past each prompt's
end take the learned `text_embed.weight` rows); the video encoder turns them into the
frame condition c; each AR step runs the image encoder on the canvas and the diffusion
MLP on the tokens committed at that step, with CFG u + w (c - u). NOVA's own sampler is a
deterministic Euler ODE per token from Gaussian noise; for RL every step is the Flow-GRPO
SDE of `FlowSDESampler` (noise level 0.7, as in the authors' MAR-GRPO code), whose mean
at noise level 0 is exactly NOVA's Euler step.

The AR schedule is NOVA's: round(N cos(pi/2 k/K)) tokens still masked after step k, steps
that would commit nothing dropped (so num_ar_steps can be below K for tiny grids).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from margrpo.models.adapters_common import MARAdapter, known_rows
from margrpo.models.nova.transformer import NOVATransformer
from margrpo.models.samplers import FlowSDESampler

# LoRA targets: the linear layers of the AR blocks (never the head's).
LORA_TARGETS = r"transformer\.(video_encoder|image_encoder)\.blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)"


def nova_schedule(num_tokens: int, num_steps: int) -> list[int]:
    """Tokens committed per AR step (diffnext NOVAPipeline: rounded cosine, zeros dropped)."""
    if num_steps < 1:
        raise ValueError(f"AR steps must be >= 1, got {num_steps}")
    ratios = np.cos(0.5 * np.pi * np.arange(num_steps + 1) / num_steps)
    lengths = np.round(ratios * num_tokens).astype("int64")
    return [int(n) for n in lengths[:-1] - lengths[1:] if n > 0]


class NOVAPolicy(MARAdapter):
    lora_targets = LORA_TARGETS

    def __init__(
        self,
        transformer: NOVATransformer,
        text_encoder: nn.Module,
        tokenizer,
        vae: nn.Module,
        *,
        flow_shift: float = 1.0,
        noise_level: float = 0.7,
        num_ar_steps: int = 64,
        head_steps: int = 25,
        cfg_scale: float = 5.0,
        temperature: float = 1.0,
    ):
        super().__init__()
        self.transformer, self.text_encoder, self.vae = transformer, text_encoder, vae
        self.tokenizer = tokenizer
        self.vae.requires_grad_(False)
        self.num_tokens, self.token_dim = transformer.num_tokens, transformer.token_dim
        self.flow_shift, self.noise_level = float(flow_shift), float(noise_level)
        self.set_text_trainable(False)
        self.configure_sampling(num_ar_steps, head_steps, cfg_scale, temperature)

    def configure_sampling(self, num_ar_steps: int, head_steps: int, cfg_scale: float, temperature: float = 1.0) -> None:
        self.schedule = nova_schedule(self.num_tokens, num_ar_steps)
        self.cfg_scale, self.temperature = float(cfg_scale), float(temperature)
        self.sampler = FlowSDESampler(head_steps, shift=self.flow_shift, noise_level=self.noise_level,
                                      temperature=self.temperature)

    # ---- parameter groups -----------------------------------------------------------
    def ar_modules(self) -> list[nn.Module]:
        return [self.transformer]  # minus the head (excluded by MARAdapter.ar_parameters)

    def head_module(self) -> nn.Module:
        return self.transformer.image_decoder

    def text_modules(self) -> list[nn.Module]:
        return [self.text_encoder]

    # ---- conditioning ---------------------------------------------------------------
    def prepare_cond(self, prompts: Sequence[str]) -> dict:
        """Token ids of the B prompts then B empty prompts (the null branch), padded to
        text_token_len, and the filled text-encoder states [2B, L, Dt] (frozen encoder)."""
        length = self.transformer.text_embed.num_tokens
        texts = list(prompts) + [""] * len(prompts)
        ids = [self.tokenizer(p, padding="max_length", max_length=length, truncation=True).input_ids for p in texts]
        lens = [len(self.tokenizer(p, max_length=length, truncation=True).input_ids) for p in texts]
        dev = self.device
        cond = {"ids": torch.as_tensor(ids, dtype=torch.long, device=dev),
                "lens": torch.as_tensor(lens, dtype=torch.long, device=dev)}
        with torch.no_grad():
            cond["text"] = self.text_states(cond)
        return cond

    def text_states(self, cond: dict) -> torch.Tensor:
        """Text-encoder states with each prompt's positions past its length replaced by the
        learned filler rows: [2B, L, Dt] in the transformer's dtype (float32; the encoder may
        be stored in bfloat16, model.llm_dtype)."""
        ids, lens = cond["ids"], cond["lens"]
        filler = self.transformer.text_embed.weight[: ids.shape[1]]
        states = self.text_encoder(input_ids=ids).last_hidden_state.to(filler.dtype)
        inside = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0) < lens.unsqueeze(1)  # [2B, L]
        return torch.where(inside.unsqueeze(-1), states, filler.expand_as(states))

    # ---- MARPolicy ------------------------------------------------------------------
    def encode_pair(self, cond: dict, canvas: torch.Tensor, known: torch.Tensor):
        """(z_c, z_u), each [B, N, W]: one pass over the 2B rows (prompt rows, then null)."""
        b = canvas.shape[0]
        text = self.text_states(cond) if self.train_text_encoder else cond["text"]
        tr, kidx = self.transformer, known_rows(known)
        with self.ar_context():
            c = tr.frame_condition(tr.text_states(text), run=self.run_block)
            z = tr.image_latents(c, torch.cat([canvas, canvas]), torch.cat([kidx, kidx]), run=self.run_block)
        z = z.to(canvas.dtype)  # float32 (the canvas dtype) even when the transformer ran in bf16
        return z[:b], z[b:]

    def head_output(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Velocity [R, D]; t is the flow sigma in [0, 1], NOVA's head reads sigma * 1000."""
        return self.transformer.image_decoder(x, t * 1000.0, z)

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, N, p*p*C] (py, px, c) tokens -> latent [B, C, H, W] -> VAE -> [0, 1] images."""
        b, (h, w), p = tokens.shape[0], self.transformer.latent_hw, self.transformer.patch
        c = self.token_dim // (p * p)
        lat = tokens.view(b, h // p, w // p, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h, w)
        cfg = self.vae.config
        lat = lat.to(next(self.vae.parameters()).dtype) * (1.0 / cfg.scaling_factor)
        if getattr(cfg, "shift_factor", None):
            lat = lat + cfg.shift_factor
        images = self.vae.decode(lat).sample.float()
        return ((images + 1.0) / 2.0).clamp(0.0, 1.0)

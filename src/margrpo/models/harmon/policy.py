"""Harmon as a `MARPolicy`: Qwen2 between the MAR encoder and decoder, MAR's DDPM head.

Generation follows wusize/Harmon (Harmon.sample, text2image.py): the prompt is wrapped in
the chat template ("Generate an image: ..."), the null prompt is "Generate an image.";
each AR step runs the MAR encoder on [64 buffer rows ; known tokens], projects them into
the LLM (proj_in), runs Qwen2 over [prompt tokens ; known tokens ; buffer rows] (causal,
prompt padding masked), adds proj_out of the LLM states back (residual), and the MAR
decoder gives z for every token. The head draws the committed tokens with CFG on epsilon
(the variance half comes from the prompted branch) and a constant CFG scale.

The official sampler runs the LLM over the prompt once and caches its keys and values;
here the prompt is recomputed at every AR step (the same numbers, and it lets the loss
back-propagate through the prompt positions when the LLM trains).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from margrpo.models.adapters_common import MARAdapter, known_rows
from margrpo.models.harmon.mar import MAR
from margrpo.models.harmon.sampler import HarmonDDPMSampler
from margrpo.models.harmon.vae import KLVAE
from margrpo.models.mar import mask_schedule

INSTRUCTION = "<|im_start|>user\n{input}<|im_end|>\n<|im_start|>assistant\n"
GENERATION = "Generate an image: {text}"
NULL_PROMPT = "Generate an image."
LORA_TARGETS = (r"llm\.model\.layers\.\d+\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj)"
                r"|mar\.(encoder|decoder)_blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)")


def build_mlp(dim: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, out))


class HarmonPolicy(MARAdapter):
    lora_targets = LORA_TARGETS

    def __init__(
        self,
        llm: nn.Module,
        mar: MAR,
        vae: KLVAE,
        tokenizer,
        *,
        image_size: int = 512,
        vae_scale: float = 0.2325,
        num_ar_steps: int = 64,
        head_steps: int = 100,
        cfg_scale: float = 3.0,
        temperature: float = 1.0,
    ):
        super().__init__()
        self.llm, self.mar, self.vae, self.tokenizer = llm, mar, vae, tokenizer
        hidden, width = llm.config.hidden_size, mar.z_proj.out_features
        self.proj_in = build_mlp(width, hidden, hidden)
        self.proj_out = build_mlp(hidden, hidden, width)
        self.vae.requires_grad_(False)
        self.vae_scale = float(vae_scale)
        side = image_size // 16  # KL-16 latents, one token per latent position (patch 1)
        self.grid = (side, side)
        self.num_tokens, self.token_dim = side * side, mar.z_proj.in_features
        self.set_text_trainable(False)
        self.configure_sampling(num_ar_steps, head_steps, cfg_scale, temperature)

    def configure_sampling(self, num_ar_steps: int, head_steps: int, cfg_scale: float, temperature: float = 1.0) -> None:
        self.schedule = mask_schedule(self.num_tokens, num_ar_steps)
        self.cfg_scale, self.temperature = float(cfg_scale), float(temperature)
        self.sampler = HarmonDDPMSampler(head_steps, temperature=self.temperature)

    def apply_options(self, *, gradient_checkpointing: bool = False, **kw) -> None:
        super().apply_options(gradient_checkpointing=gradient_checkpointing, **kw)
        if gradient_checkpointing:  # Qwen2's own per-layer checkpointing (transformers >= 5)
            self.llm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            self.llm.activation_checkpointing_disable()

    # ---- parameter groups -----------------------------------------------------------
    def ar_modules(self) -> list[nn.Module]:
        return [self.mar, self.proj_in, self.proj_out, self.llm]

    def head_module(self) -> nn.Module:
        return self.mar.diffloss

    def text_modules(self) -> list[nn.Module]:
        """The LLM's token embeddings (and its unused LM head): the only text-only parts."""
        return [self.llm.get_input_embeddings(), self.llm.get_output_embeddings()]

    # ---- conditioning ---------------------------------------------------------------
    def prepare_cond(self, prompts: Sequence[str]) -> dict:
        """Token ids [2B, L] of the B templated prompts then B null prompts, right-padded,
        with their attention mask."""
        texts = [INSTRUCTION.format(input=GENERATION.format(text=p)) for p in prompts]
        texts += [INSTRUCTION.format(input=NULL_PROMPT)] * len(prompts)
        ids = [self.tokenizer.encode(t, add_special_tokens=True) for t in texts]
        length = max(len(i) for i in ids)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        dev = self.device
        mask = torch.tensor([[1] * len(i) + [0] * (length - len(i)) for i in ids], dtype=torch.bool, device=dev)
        ids = torch.tensor([i + [pad] * (length - len(i)) for i in ids], dtype=torch.long, device=dev)
        return {"ids": ids, "mask": mask}

    # ---- MARPolicy ------------------------------------------------------------------
    def guide(self, c: torch.Tensor, u: torch.Tensor, w: float) -> torch.Tensor:
        """CFG on epsilon only; the variance values are the prompted branch's."""
        d = self.token_dim
        return torch.cat([u[..., :d] + w * (c[..., :d] - u[..., :d]), c[..., d:]], dim=-1)

    def encode_pair(self, cond: dict, canvas: torch.Tensor, known: torch.Tensor):
        b, buf = canvas.shape[0], self.mar.buffer_size
        kidx = known_rows(known)
        tokens, kidx = torch.cat([canvas, canvas]), torch.cat([kidx, kidx])
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.train_text_encoder):
            text = self.llm.get_input_embeddings()(cond["ids"])
        with self.ar_context():
            x = self.mar.encode(tokens, kidx, self.grid, self.run_block)  # [2B, buf + k, W]
            h = self.proj_in(x)
            h = torch.cat([h[:, buf:], h[:, :buf]], dim=1)  # buffer rows last: they see every token
            attn = torch.cat([cond["mask"], cond["mask"].new_ones(2 * b, h.shape[1])], dim=1)
            pos = (attn.long().cumsum(1) - 1).clamp_min(0)
            llm_model = self.llm.get_decoder() if hasattr(self.llm, "get_decoder") else self.llm.model
            llm_model.train(self.gradient_checkpointing and torch.is_grad_enabled())  # HF checkpoints in train mode
            embeds = torch.cat([text.to(h.dtype), h], dim=1)
            if text.dtype != torch.float32:  # the LLM stores bfloat16 base weights (LoRA, model.llm_dtype)
                embeds = embeds.to(text.dtype)
            out = llm_model(inputs_embeds=embeds, attention_mask=attn.long(), position_ids=pos,
                            use_cache=False).last_hidden_state[:, -h.shape[1]:].to(h.dtype)
            llm_model.eval()
            out = torch.cat([out[:, -buf:], out[:, :-buf]], dim=1)
            z = self.mar.decode(x + self.proj_out(out), kidx, self.grid, self.run_block)
        z = z.to(canvas.dtype)  # float32 (the canvas dtype) even when the transformer ran in bf16
        return z[:b], z[b:]

    def head_output(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """[R, 2D]: epsilon and variance values; t is timestep / 1000 (rounded back)."""
        return self.mar.diffloss.net(x, (t * 1000.0).round(), z)

    @torch.no_grad()
    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        b, (h, w) = tokens.shape[0], self.grid
        lat = (tokens / self.vae_scale).transpose(1, 2).reshape(b, -1, h, w)
        images = self.vae.decode(lat.to(self.vae.post_quant_conv.weight.dtype)).float()
        return ((images + 1.0) / 2.0).clamp(0.0, 1.0)

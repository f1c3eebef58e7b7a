"""TinyMAR: the embedded masked-autoregressive model (pixel-patch tokens + diffusion head).

A 32x32 image is cut into 8x8 pixel patches (N = 16 tokens of D = 192 values in [-1, 1]),
so one object of the world spans one to four tokens. Generation runs K AR steps over a
random per-image order with MAR's cosine schedule; each committed token is drawn by the
diffusion head with classifier-free guidance. Implements `MARPolicy`.

Randomness is counter-based (models/noise.py): the token order and every head-chain draw
of an image are pure functions of its seed and coordinates, drawn for the whole batch in
one call per AR step on the model's device, so an image replays from its seed in any
batch and on either device.

Saved and loaded with diffusers' ModelMixin/ConfigMixin (config.json + safetensors).
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from margrpo.models import noise
from margrpo.models.rollout import RolloutMixin
from margrpo.models.encoder import MAREncoder
from margrpo.models.head import DiffusionHead
from margrpo.models.samplers import GaussianSampler, build_sampler
from margrpo.models.tokenizer import WordTokenizer

# TinyMAR.consistency_reference (its docstring gives the measurement).
TINY_CONSISTENCY_REFERENCE = 0.4


def mask_schedule(num_tokens: int, num_steps: int) -> list[int]:
    """Tokens committed at each AR step (MAR's cosine schedule, method.md §1).

    After step i, floor(N cos(pi/2 (i+1)/K)) tokens stay masked, at least one until the
    last step and at least one committed per step.
    """
    if not 1 <= num_steps <= num_tokens:
        raise ValueError(f"AR steps must be in [1, {num_tokens}] (one token per step at least), got {num_steps}")
    counts, known = [], 0
    for i in range(num_steps):
        if i == num_steps - 1:
            masked = 0
        else:
            masked = math.floor(num_tokens * math.cos(math.pi / 2 * (i + 1) / num_steps))
            masked = max(1, min(masked, num_tokens - known - 1))
        counts.append(num_tokens - known - masked)
        known = num_tokens - masked
    return counts


class TinyMAR(RolloutMixin, ModelMixin, ConfigMixin):
    config_name = "config.json"

    # Built from params (margrpo.models.loading.new_model) or from a saved config.json: every
    # setting params.yaml has is required here, so no second default can drift from the
    # config's. The defaulted four are constants params.yaml does not set.
    @register_to_config
    def __init__(
        self,
        *,
        vocab: Sequence[str],
        max_prompt_len: int,
        image_size: int,
        patch_size: int,
        width: int,
        depth: int,
        heads: int,
        cond_dim: int,
        head_width: int,
        head_depth: int,
        sampler: str,
        flow_shift: float,
        num_ar_steps: int,
        head_steps: int,
        cfg_scale: float,
        temperature: float,
        channels: int = 3,
        num_train_timesteps: int = 1000,  # ddpm sampler only
        beta_schedule: str = "linear",  # ddpm sampler only
        flow_noise_level: float = 0.7,  # flow sampler only: SDE noise scale of a head step
    ):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(
                f"image_size {image_size} is not divisible by patch_size {patch_size}; "
                "choose a patch size that divides the image size (e.g. 8 for 32x32)"
            )
        if not vocab:
            raise ValueError("TinyMAR needs a prompt vocabulary: [pad, null, word, ...] "
                             "(the embedded study passes margrpo.world.grammar.VOCAB)")
        self.grid = image_size // patch_size
        self.num_tokens = self.grid * self.grid
        self.token_dim = patch_size * patch_size * channels
        self.tokenizer = WordTokenizer(vocab, max_prompt_len)
        self.encoder = MAREncoder(
            len(vocab), max_prompt_len, self.num_tokens, self.token_dim, width, depth, heads, cond_dim
        )
        self.head = DiffusionHead(self.token_dim, cond_dim, head_width, head_depth)
        self.compute_dtype = torch.float32
        self.configure_sampling()

    def set_precision(self, dtype: torch.dtype) -> None:
        """Precision of the transformer and head forward passes (runtime.dtype): float32, or
        bfloat16 under autocast. Their outputs are cast back to float32, so head chains,
        Gaussian means, log-probs, advantages and losses stay float32: a log-prob sums D = 192
        squared residuals to values of order 100, where bfloat16's 8-bit mantissa would leave
        an error of order 1 in the PPO ratio's exponent."""
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"compute dtype must be float32 or bfloat16, got {dtype}")
        self.compute_dtype = dtype

    def _forward_precision(self):
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()  # no autocast at all: float32 numbers stay bitwise as before
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    # ---- sampling settings (not weights: change freely after loading) ---------------
    def configure_sampling(
        self,
        num_ar_steps: int | None = None,
        head_steps: int | None = None,
        cfg_scale: float | None = None,
        temperature: float | None = None,
    ) -> None:
        c = self.config
        self.num_ar_steps = num_ar_steps or c.num_ar_steps
        self.cfg_scale = float(c.cfg_scale if cfg_scale is None else cfg_scale)
        self.temperature = float(c.temperature if temperature is None else temperature)
        self.schedule = mask_schedule(self.num_tokens, self.num_ar_steps)
        kw = (
            dict(num_train_timesteps=c.num_train_timesteps, beta_schedule=c.beta_schedule)
            if c.sampler == "ddpm"
            else dict(shift=c.flow_shift, noise_level=c.flow_noise_level)
        )
        self.sampler: GaussianSampler = build_sampler(c.sampler, head_steps or c.head_steps, self.temperature, **kw)

    # ---- tokens <-> images, text -> ids ---------------------------------------------
    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [0, 1] -> [B, N, D] in [-1, 1] (row-major patches, (c, y, x) inside)."""
        b, ch, h, w = images.shape
        p, g = self.config.patch_size, self.grid
        if h != self.config.image_size or w != self.config.image_size:
            raise ValueError(f"images are {h}x{w}, the model expects {self.config.image_size}x{self.config.image_size}")
        x = images.reshape(b, ch, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, ch * p * p)
        return x * 2.0 - 1.0

    def decode_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        p, g, ch = self.config.patch_size, self.grid, self.config.channels
        x = tokens.reshape(b, g, g, ch, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, g * p, g * p)
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompt word ids [B, L] over the model's own vocabulary (clear error on unknown words)."""
        return self.tokenizer(prompts)

    # ---- MARPolicy ------------------------------------------------------------------
    @property
    def consistency_reference(self) -> float:
        """Grey token value 0.4 (pixel 0.7) that the consistency filter centres tokens on
        (MARPolicy.consistency_reference): midway between the white background (+1) and the
        mean ink of object pixels, so blank vs blank scores +1 and a token about half or
        more inked scores negative against blank (method/selection.py content_cos).

        Measured over 8x8x3 tokens, an object pixel being one with a channel below pixel 0.5
        (every world colour has one channel <= 0.15, the background none):
          rendered scenes of the 704 training prompts x 3 (2112 images, seed 0): 18.8% object
            pixels, mean token value -0.19; background +1.00; midpoint 0.41;
          the base model's samples (256 training prompts, seed 0): 21.8% object pixels, mean
            -0.24; background +0.99; midpoint 0.38.
        probes/consistency_scores.py prints the same measurement on its rollouts."""
        return TINY_CONSISTENCY_REFERENCE

    def ar_parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.encoder.parameters()

    def head_parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.head.parameters()

    def head_output(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        with self._forward_precision():
            return self.head(x, t, z).float()

    # head_output split in two (models/chains.py shares the first part between chains of a token)
    def head_condition(self, t: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with self._forward_precision():
            return self.head.condition(t, z)

    def head_apply(self, x: torch.Tensor, cond: tuple[torch.Tensor, ...]) -> torch.Tensor:
        with self._forward_precision():
            return self.head.apply_condition(x, cond).float()

    def prepare_cond(self, prompts: Sequence[str]) -> torch.Tensor:
        return self.tokenize(prompts).to(self.device)

    def encode_pair(self, ids: torch.Tensor, canvas: torch.Tensor, known: torch.Tensor):
        """(z_cond, z_null), each [B, N, C] float32, from one encoder call on [2B] sequences."""
        b = ids.shape[0]
        null = torch.arange(2 * b, device=ids.device) >= b
        with self._forward_precision():
            z = self.encoder(torch.cat([ids, ids]), torch.cat([canvas, canvas]), torch.cat([known, known]), null).float()
        return z[:b], z[b:]

    def token_order(self, seeds: torch.Tensor) -> torch.Tensor:
        return noise.token_order(seeds.to(self.device), self.num_tokens)

    def step_noise(self, seeds: torch.Tensor, i: int, idx: torch.Tensor, rest: torch.Tensor | None):
        """Chain noise [T+1, B, n, D] of the whole batch in one call, addressed by token
        position; the speculative tokens draw from their own stream."""
        t1, d = self.sampler.num_steps + 1, self.token_dim
        spec = noise.chain_noise(seeds, i, rest, t1, d, noise.SPECULATIVE) if rest is not None and rest.shape[1] else None
        return noise.chain_noise(seeds, i, idx, t1, d, noise.COMMITTED), spec

    # ---- pretraining ----------------------------------------------------------------
    def training_loss(
        self,
        images: torch.Tensor,
        prompt_ids: torch.Tensor,
        generator: torch.Generator,
        prompt_dropout: float,
        diffusion_batch_mul: int,
    ) -> torch.Tensor:
        """MAR loss: mask a random fraction of tokens (ratio cos(pi/2 u), u ~ U(0,1), at
        least one), predict z for all, and train the head on the masked tokens with
        `diffusion_batch_mul` noise draws each. Prompts dropped to the null prompt with
        probability `prompt_dropout` (that branch is CFG's unconditional model).

        `generator` is a CPU generator: its draws are made on the CPU and moved to the
        images' device, so a run draws the same masks and noise on every device."""
        x = self.patchify(images)
        b, n_tok, _ = x.shape
        dev = x.device
        ratio = torch.cos(math.pi / 2 * torch.rand(b, generator=generator))
        n_mask = (ratio * n_tok).ceil().clamp(1, n_tok).long()
        ranks = torch.rand(b, n_tok, generator=generator).argsort(1).argsort(1)
        masked = (ranks < n_mask[:, None]).to(dev)
        null = (torch.rand(b, generator=generator) < prompt_dropout).to(dev)
        with self._forward_precision():
            z = self.encoder(prompt_ids, x * (~masked)[..., None], ~masked, null).float()
        zm, xm = z[masked], x[masked]
        zm, xm = zm.repeat(diffusion_batch_mul, 1), xm.repeat(diffusion_batch_mul, 1)
        xt, t, target = self.sampler.training_pair(xm, generator)
        with self._forward_precision():
            pred = self.head(xt, t, zm).float()
        return (pred - target).pow(2).mean()

"""TinyMAR: the embedded masked-autoregressive model (pixel-patch tokens + diffusion head).

A 32x32 image is cut into 8x8 pixel patches (N = 16 tokens of D = 192 values in [-1, 1]),
so one object of the world spans one to four tokens. Generation runs K AR steps over a
random per-image order with MAR's cosine schedule; each committed token is drawn by the
diffusion head with classifier-free guidance. Implements `MARPolicy`.

Saved and loaded with diffusers' ModelMixin/ConfigMixin (config.json + safetensors).
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config

from margrpo.models.chains import gather_rows, sample_chain
from margrpo.models.encoder import MAREncoder
from margrpo.models.head import DiffusionHead
from margrpo.models.protocol import ARStep, Rollout
from margrpo.models.samplers import GaussianSampler, build_sampler

_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, step) pairs apart
_SEED_MOD = 2**63 - 1


def step_seed(seed: int, step: int) -> int:
    """Seed of the generator for AR step `step` of an image with seed `seed`."""
    return (int(seed) + (step + 1) * _SEED_MIX) % _SEED_MOD


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


class TinyMAR(ModelMixin, ConfigMixin):
    config_name = "config.json"

    @register_to_config
    def __init__(
        self,
        vocab: Sequence[str] = (),
        max_prompt_len: int = 16,
        image_size: int = 32,
        patch_size: int = 8,
        channels: int = 3,
        width: int = 192,
        depth: int = 4,
        heads: int = 4,
        cond_dim: int = 192,
        head_width: int = 256,
        head_depth: int = 3,
        sampler: str = "ddpm",
        num_train_timesteps: int = 1000,
        beta_schedule: str = "linear",
        flow_shift: float = 1.0,
        flow_noise_level: float = 0.7,
        num_ar_steps: int = 16,
        head_steps: int = 20,
        cfg_scale: float = 3.0,
        temperature: float = 1.0,
    ):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(
                f"image_size {image_size} is not divisible by patch_size {patch_size}; "
                "choose a patch size that divides the image size (e.g. 8 for 32x32)"
            )
        if not vocab:
            raise ValueError("TinyMAR needs the prompt vocabulary (margrpo.world.grammar.VOCAB)")
        self.grid = image_size // patch_size
        self.num_tokens = self.grid * self.grid
        self.token_dim = patch_size * patch_size * channels
        self.word_to_id = {w: i for i, w in enumerate(vocab)}
        self.encoder = MAREncoder(
            len(vocab), max_prompt_len, self.num_tokens, self.token_dim, width, depth, heads, cond_dim
        )
        self.head = DiffusionHead(self.token_dim, cond_dim, head_width, head_depth)
        self.configure_sampling()

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

    def unpatchify(self, tokens: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        p, g, ch = self.config.patch_size, self.grid, self.config.channels
        x = tokens.reshape(b, g, g, ch, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, g * p, g * p)
        return ((x + 1.0) / 2.0).clamp(0.0, 1.0)

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """Prompt word ids [B, L]; the world grammar's tokenizer (clear error on unknown words)."""
        from margrpo.world.grammar import VOCAB, tokenize

        if list(self.config.vocab) != list(VOCAB):
            raise ValueError(
                "this checkpoint's prompt vocabulary differs from margrpo.world.grammar.VOCAB "
                f"({len(self.config.vocab)} vs {len(VOCAB)} words); retrain the base model "
                "(dvc repro pretrain_base) or use the grammar it was trained with"
            )
        return torch.tensor([tokenize(p, max_len=self.config.max_prompt_len) for p in prompts], dtype=torch.long)

    # ---- MARPolicy ------------------------------------------------------------------
    def ar_parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.encoder.parameters()

    def head_parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.head.parameters()

    def head_output(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.head(x, t, z)

    def _encode_pair(self, ids: torch.Tensor, canvas: torch.Tensor, known: torch.Tensor):
        """(z_cond, z_null), each [B, N, C], from one encoder call on [2B] sequences."""
        b = ids.shape[0]
        null = torch.cat([torch.zeros(b, dtype=torch.bool), torch.ones(b, dtype=torch.bool)])
        z = self.encoder(torch.cat([ids, ids]), torch.cat([canvas, canvas]), torch.cat([known, known]), null)
        return z[:b], z[b:]

    def encode(self, rollout: Rollout, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = rollout.steps[step]
        return self._encode_pair(rollout.cond, s.canvas, s.known)

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[str],
        *,
        seeds: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        speculative_steps: Sequence[int] = (),
    ) -> Rollout:
        b, n_tok, d, t_steps = len(prompts), self.num_tokens, self.token_dim, self.sampler.num_steps
        ids = self.tokenize(prompts)
        if seeds is None:
            seeds = torch.randint(0, _SEED_MOD, (b,), generator=generator, dtype=torch.long)
        seeds = torch.as_tensor(seeds, dtype=torch.long)
        if seeds.shape != (b,):
            raise ValueError(f"seeds must have shape ({b},), got {tuple(seeds.shape)}")
        order = torch.stack([torch.randperm(n_tok, generator=torch.Generator().manual_seed(int(s))) for s in seeds])
        canvas = torch.zeros(b, n_tok, d)
        known = torch.zeros(b, n_tok, dtype=torch.bool)
        steps, start, spec_set = [], 0, set(speculative_steps)
        for i, n in enumerate(self.schedule):
            z_c, z_u = self._encode_pair(ids, canvas, known)
            idx = order[:, start : start + n]
            rest = order[:, start + n :]
            gens = [torch.Generator().manual_seed(step_seed(s, i)) for s in seeds]
            # Committed-token noise first, so the speculative draws never change the images.
            noise = torch.stack([torch.randn(t_steps + 1, n, d, generator=g) for g in gens], dim=1)
            chain, mean, std, logp = sample_chain(
                self, gather_rows(z_c, idx), gather_rows(z_u, idx), noise, self.cfg_scale
            )
            rec = ARStep(i, canvas.clone(), known.clone(), idx, chain, mean, std, logp)
            if i in spec_set:
                rec.speculative = canvas.clone()
                rec.speculative.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, d), chain[-1])
                rec.spec_idx = rest
                if rest.shape[1]:
                    sn = torch.stack([torch.randn(t_steps + 1, rest.shape[1], d, generator=g) for g in gens], dim=1)
                    sc, _, _, sl = sample_chain(self, gather_rows(z_c, rest), gather_rows(z_u, rest), sn, self.cfg_scale)
                    rec.speculative.scatter_(1, rest.unsqueeze(-1).expand(-1, -1, d), sc[-1])
                    rec.spec_chain, rec.spec_logp = sc, sl
            steps.append(rec)
            canvas.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, d), chain[-1])
            known.scatter_(1, idx, True)
            start += n
        return Rollout(
            prompts=list(prompts),
            images=self.unpatchify(canvas),
            tokens=canvas,
            steps=steps,
            seeds=seeds,
            cfg_scale=self.cfg_scale,
            temperature=self.temperature,
            cond=ids,
            extras={"order": order},
        )

    # ---- pretraining ----------------------------------------------------------------
    def training_loss(
        self,
        images: torch.Tensor,
        prompt_ids: torch.Tensor,
        generator: torch.Generator,
        prompt_dropout: float = 0.1,
        diffusion_batch_mul: int = 4,
    ) -> torch.Tensor:
        """MAR loss: mask a random fraction of tokens (ratio cos(pi/2 u), u ~ U(0,1), at
        least one), predict z for all, and train the head on the masked tokens with
        `diffusion_batch_mul` noise draws each. Prompts dropped to the null prompt with
        probability `prompt_dropout` (that branch is CFG's unconditional model)."""
        x = self.patchify(images)
        b, n_tok, _ = x.shape
        ratio = torch.cos(math.pi / 2 * torch.rand(b, generator=generator))
        n_mask = (ratio * n_tok).ceil().clamp(1, n_tok).long()
        ranks = torch.rand(b, n_tok, generator=generator).argsort(1).argsort(1)
        masked = ranks < n_mask[:, None]
        null = torch.rand(b, generator=generator) < prompt_dropout
        z = self.encoder(prompt_ids, x * (~masked)[..., None], ~masked, null)
        zm, xm = z[masked], x[masked]
        zm, xm = zm.repeat(diffusion_batch_mul, 1), xm.repeat(diffusion_batch_mul, 1)
        xt, t, target = self.sampler.training_pair(xm, generator)
        return (self.head(xt, t, zm) - target).pow(2).mean()

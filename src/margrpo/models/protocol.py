"""What the RL trainer needs from a MAR model, as a typed protocol.

The tiny embedded MAR implements it; a NOVA or Harmon adapter implements the same five
members and gets the trainer, the estimators and the pipeline for free. The trainer never
touches a model's internals: only `rollout`, `encode`, `head_output`, the two parameter
groups and the attributes below (consistency_reference included).

Shapes: B images, N tokens per image, D token dim, C latent dim, T head steps, K AR steps,
n_i tokens committed at AR step i (the same n_i for every image of a batch).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence, runtime_checkable

import torch

from margrpo.models.samplers import GaussianSampler


@dataclass
class ARStep:
    """Everything about AR step i needed to recompute its log-probs.

    canvas: [B, N, D] tokens known before the step (zeros where unknown).
    known: [B, N] bool, True where canvas holds a committed token.
    commit_idx: [B, n_i] long, token positions committed at this step.
    chain: [T+1, B, n_i, D] head states; chain[0] is the initial noise, chain[T] the
        committed tokens. Transition j maps chain[j] -> chain[j+1].
    mean: [T, B, n_i, D] CFG-guided Gaussian means of the transitions at rollout.
    std: [T, B, n_i] their standard deviations (temperature included).
    logp: [T, B, n_i] log N(chain[j+1]; mean[j], std[j]^2 I), float32.
    speculative: [B, N, D] or None: the head's prediction of every token at this step
        (committed tokens: chain[T]; still-masked tokens: one head chain from z_i, then
        discarded; tokens known before the step: the canvas). method.md §3.3.
    spec_idx: [B, m_i] positions still masked after the step (speculative tokens), with
        their head chains spec_chain [T+1, B, m_i, D] and log-probs spec_logp [T, B, m_i]
        (only on speculative steps; the authors' NOVA loss also scores these tokens).
    extra_chain: [T+1, M, B, n_i, D] or None: M more head chains per committed token from
        the step's latents, with their log-probs extra_logp [T, M, B, n_i] (only on the
        rollout's extra_chain_steps: the uncertainty map's chains, models/chains.py).
    """

    index: int
    canvas: torch.Tensor
    known: torch.Tensor
    commit_idx: torch.Tensor
    chain: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    logp: torch.Tensor
    speculative: torch.Tensor | None = None
    spec_idx: torch.Tensor | None = None
    spec_chain: torch.Tensor | None = None
    spec_logp: torch.Tensor | None = None
    extra_chain: torch.Tensor | None = None
    extra_logp: torch.Tensor | None = None


@dataclass
class Rollout:
    """A batch of generated images and the record that replays and rescores them.

    seeds: [B] int64 per-image seeds (CPU). `policy.rollout(prompts, seeds=seeds)` with the
        same parameters, cfg and temperature reproduces the images bit for bit: the token
        order and every noise draw of image b are pure functions of seeds[b] and their
        coordinates (models/noise.py), independent of the batch it sits in and of the device
        (replayed in a batch of another size or on another device, an image differs only by
        float rounding of the batched matmuls).
    cond: model-specific conditioning needed by `encode` (token ids for the tiny MAR).
    """

    prompts: list[str]
    images: torch.Tensor  # [B, 3, H, W] in [0, 1]
    tokens: torch.Tensor  # [B, N, D]
    steps: list[ARStep]
    seeds: torch.Tensor
    cfg_scale: float
    temperature: float
    cond: object = None
    extras: dict = field(default_factory=dict)
    sde_steps: tuple[int, ...] | None = None  # the SDE window (rollout's sde_steps); None: all stochastic

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]


@runtime_checkable
class MARPolicy(Protocol):
    sampler: GaussianSampler
    num_tokens: int
    token_dim: int
    num_ar_steps: int
    cfg_scale: float

    @property
    def consistency_reference(self) -> float:
        """Neutral token value (in token units) that the consistency filter centres tokens on
        before taking their cosine (method.md §3.3: score cos(xhat - r, x_fin - r)).

        The cosine should compare what two tokens depict, not the offset every token of the
        model shares: pixel tokens of a white-background image all sit near +1, so their
        raw cosine is positive for almost any pair and the filter keeps everything. A model
        returns the value between "empty" and "content" tokens (TinyMAR: a grey between the
        white background and the mean object ink); zero-mean latent tokens (NOVA, Harmon)
        return 0.0, the plain cosine of the paper."""
        ...

    def rollout(
        self,
        prompts: Sequence[str],
        *,
        seeds: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        speculative_steps: Sequence[int] = (),
        extra_chains: int = 0,
        extra_chain_steps: Sequence[int] = (),
        sde_steps: Sequence[int] | None = None,
    ) -> Rollout:
        """Generate one image per prompt (repeat a prompt G times for a group)
        (models/rollout.py RolloutMixin.rollout: the arguments)."""
        ...

    def encode(self, rollout: Rollout, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Recompute (z_cond, z_null), each [B, N, C], for AR step `step` of `rollout`,
        with gradient to the AR parameters."""
        ...

    def head_output(self, x: torch.Tensor, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Raw head prediction (epsilon or velocity): x [R, D], t [R], z [R, C] -> [R, D]."""
        ...

    def ar_parameters(self) -> Iterator[torch.nn.Parameter]: ...

    def head_parameters(self) -> Iterator[torch.nn.Parameter]: ...

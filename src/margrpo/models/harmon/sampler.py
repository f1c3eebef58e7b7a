"""Harmon's head sampler (MAR's DiffLoss): cosine-schedule DDPM respaced to T steps,
epsilon prediction, learned-range variance.

From a reading of wusize/Harmon src/models/mar/diffusion (guided-diffusion's
GaussianDiffusion + SpacedDiffusion): tables in float64, cast to float32 at use; the head
reads the original (unspaced) integer timestep; the variance is interpolated in log space
between the posterior variance (clipped) and beta by the head's second output half v in
[-1, 1]; temperature scales the noise. One difference, needed for an exact log-density:
the official sampler adds no noise on its last step (t = 0); here that step draws with its
learned variance too (std about 0.006 at T = 100), so the committed token is the last
sampled state. With that noise set to zero the chain is exactly the official one.

Transition j runs spaced step i = T - 1 - j. std is per element ([..., D]): the learned
variance differs per channel.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from margrpo.models.samplers import FlowSDESampler, GaussianSampler


def cosine_betas(num_train_timesteps: int = 1000, max_beta: float = 0.999) -> np.ndarray:
    abar = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    n = num_train_timesteps
    return np.array([min(1 - abar((i + 1) / n) / abar(i / n), max_beta) for i in range(n)], dtype=np.float64)


def space_timesteps(num_train_timesteps: int, count: int) -> list[int]:
    """`count` timesteps evenly spread over [0, num_train_timesteps) (one section)."""
    stride = (num_train_timesteps - 1) / (count - 1) if count > 1 else 1
    return sorted({round(k * stride) for k in range(count)})


class HarmonDDPMSampler(GaussianSampler):
    def __init__(self, num_steps: int = 100, temperature: float = 1.0, num_train_timesteps: int = 1000):
        if not 2 <= num_steps <= num_train_timesteps:
            raise ValueError(f"Harmon head steps must be in [2, {num_train_timesteps}], got {num_steps}")
        self.num_steps, self.temperature = num_steps, float(temperature)
        base_abar = np.cumprod(1.0 - cosine_betas(num_train_timesteps))
        self.timestep_map = space_timesteps(num_train_timesteps, num_steps)
        if len(self.timestep_map) != num_steps:
            raise ValueError(f"cannot space {num_steps} distinct steps over {num_train_timesteps}")
        last, betas = 1.0, []
        for t in self.timestep_map:
            betas.append(1.0 - base_abar[t] / last)
            last = base_abar[t]
        betas = np.array(betas)
        abar = np.cumprod(1.0 - betas)
        abar_prev = np.append(1.0, abar[:-1])
        post_var = betas * (1.0 - abar_prev) / (1.0 - abar)
        f = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64)).float()  # noqa: E731
        self.sqrt_recip_abar = f(np.sqrt(1.0 / abar))
        self.sqrt_recipm1_abar = f(np.sqrt(1.0 / abar - 1.0))
        self.coef_x0 = f(betas * np.sqrt(abar_prev) / (1.0 - abar))
        self.coef_xt = f((1.0 - abar_prev) * np.sqrt(1.0 - betas) / (1.0 - abar))
        self.min_log = f(np.log(np.append(post_var[1], post_var[1:])))
        self.max_log = f(np.log(betas))
        self.betas64 = betas
        self.sqrt_abar_prev, self.sqrt_1m_abar_prev = f(np.sqrt(abar_prev)), f(np.sqrt(1.0 - abar_prev))

    def training_pair(self, x0, generator):
        raise NotImplementedError("Harmon's head is loaded from its checkpoint, not pretrained here")

    def time_input(self, j: int) -> float:
        """The original integer timestep / 1000 (the head rounds it back)."""
        return self.timestep_map[self.num_steps - 1 - j] / 1000.0

    def transition(self, x: torch.Tensor, j: int, out: torch.Tensor):
        i = self.num_steps - 1 - j
        d = x.shape[-1]
        eps, v = out[..., :d], out[..., d:]
        x0 = self.sqrt_recip_abar[i] * x - self.sqrt_recipm1_abar[i] * eps
        mean = self.coef_x0[i] * x0 + self.coef_xt[i] * x
        frac = (v + 1) / 2
        log_var = frac * self.max_log[i] + (1 - frac) * self.min_log[i]
        return mean, torch.exp(0.5 * log_var) * self.temperature

    def ode_mean(self, x: torch.Tensor, j: int, out: torch.Tensor) -> torch.Tensor:
        """DDIM (eta = 0) from the epsilon half of the head output."""
        i = self.num_steps - 1 - j
        eps = out[..., : x.shape[-1]]
        x0 = self.sqrt_recip_abar[i] * x - self.sqrt_recipm1_abar[i] * eps
        return self.sqrt_abar_prev[i] * x0 + self.sqrt_1m_abar_prev[i] * eps

    def clean_prediction(self, x: torch.Tensor, j: int, out: torch.Tensor) -> torch.Tensor:
        i = self.num_steps - 1 - j
        return self.sqrt_recip_abar[i] * x - self.sqrt_recipm1_abar[i] * out[..., : x.shape[-1]]

    def _q_coeffs(self, j: int) -> tuple[float, float]:
        # Forward step s_j from s_{j+1}: spaced step i = T-1-j adds noise of variance beta_i.
        beta = float(self.betas64[self.num_steps - 1 - j])
        return math.sqrt(1.0 - beta), math.sqrt(beta)

    # The forward chain q and its log-density have the same form as the flow sampler's,
    # given _q_coeffs: reuse them.
    q_chain = FlowSDESampler.q_chain
    q_log_prob = FlowSDESampler.q_log_prob

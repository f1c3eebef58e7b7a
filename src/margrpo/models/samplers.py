"""Diffusion-head samplers as explicit Gaussian transition kernels (method.md §1).

A head chain has T transitions over states s_0 .. s_T: s_0 is Gaussian noise, s_T is the
token. Transition j maps s_j -> s_{j+1} with s_{j+1} ~ N(mean_j, std_j^2 I); mean_j depends
on the head output at (s_j, time_j), std_j does not depend on parameters. Because every
transition is an exact Gaussian, the policy log-prob, the KL to a reference and the forward
(noising) process q(s_{0:T-1} | s_T) used by the `elbo` / `posterior` estimators are all
closed-form; the samplers below expose exactly those pieces.

Conventions: tokens x have shape [..., D]; std has the shape of x without the last dim, so
one scalar std per token and step. All arithmetic in float32.

- DDPM (MAR, Harmon): epsilon prediction, respaced to T steps from `num_train_timesteps`;
  std = temperature * sqrt(posterior variance). The posterior variance of the final step
  (t -> clean) is 0, so that step instead uses the small fixed variance beta_t of its
  respaced step ("fixed large" for the last step only): every step then has a density and
  the committed token is the final sampled state.
- Flow-matching SDE (NOVA, Flow-GRPO form): velocity v = eps - x0 with x_sigma =
  (1 - sigma) x0 + sigma eps; all T steps are stochastic, the last one included.

SDE window (MixGRPO, Flow-GRPO-Fast): a chain may take only some transitions
stochastically and the rest by the sampler's deterministic counterpart, `ode_mean` (the
Euler step of the probability-flow ODE for the flow head, DDIM with eta = 0 for DDPM),
which has the same marginals as the stochastic step when the head is exact. A
deterministic transition has no density: `step(..., stochastic=False)` records std 0 and
log-prob 0, and no loss may score it (training/trainer.py scores the window only).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler

LOG_2PI = math.log(2.0 * math.pi)


def per_element_std(std: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """std [...] (one per token) or [..., D] (one per element, e.g. Harmon's learned
    variance) -> a float32 tensor that broadcasts against x [..., D]."""
    std = std.float()
    return std if std.dim() == x.dim() else std.unsqueeze(-1)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, diag(std^2)) summed over the last dim. x, mean: [..., D]; std: [...]
    (one per token) or [..., D] (one per element)."""
    d = x.shape[-1]
    std = std.float()
    if std.dim() == x.dim():  # per-element std (learned variance)
        z = (x.float() - mean.float()) / std
        return (-0.5 * z.pow(2) - torch.log(std)).sum(-1) - 0.5 * d * LOG_2PI
    sq = (x.float() - mean.float()).pow(2).sum(-1)
    return -sq / (2.0 * std**2) - d * torch.log(std) - 0.5 * d * LOG_2PI


def gaussian_kl_same_std(mean_p: torch.Tensor, mean_q: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean_p, S) || N(mean_q, S)) = sum |mean_p - mean_q|^2 / (2 s^2), per token;
    std [...] or [..., D] as in gaussian_log_prob."""
    if std.dim() == mean_p.dim():
        return ((mean_p.float() - mean_q.float()) / std.float()).pow(2).sum(-1) / 2.0
    return (mean_p.float() - mean_q.float()).pow(2).sum(-1) / (2.0 * std.float() ** 2)


class GaussianSampler(ABC):
    """T Gaussian transitions; subclasses fix the noise tables and the mean formula."""

    num_steps: int
    temperature: float

    # ---- training (pretraining loss of the head) -------------------------------------
    @abstractmethod
    def training_pair(
        self, x0: torch.Tensor, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Noised input, head time input [R] in [0, 1], regression target. x0: [R, D]."""

    # ---- sampling --------------------------------------------------------------------
    @abstractmethod
    def time_input(self, j: int) -> float:
        """Head time input (in [0, 1]) at transition j."""

    @abstractmethod
    def transition(self, x: torch.Tensor, j: int, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of s_{j+1} given s_j = x and head output `out` at step j.

        x, out: [..., D]; mean: [..., D]; std: [...] (temperature applied).
        """

    @abstractmethod
    def q_chain(self, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Forward-process chain ending in x0: states [T+1, ..., D] with states[T] = x0.

        noise: [T, ..., D] standard normal draws (common random numbers are the caller's
        choice). states[j] is drawn from q(s_j | s_{j+1}), the Gaussian Markov chain whose
        marginals are the training marginals of the head.
        """

    @abstractmethod
    def q_log_prob(self, states: torch.Tensor) -> torch.Tensor:
        """log q(s_{0:T-1} | s_T) of a chain [T+1, ..., D]; returns [...]."""

    @abstractmethod
    def ode_mean(self, x: torch.Tensor, j: int, out: torch.Tensor) -> torch.Tensor:
        """Deterministic transition j (the ODE / DDIM step with the same marginals):
        s_{j+1} from s_j = x and head output `out` [..., D'] (a sampler whose output has
        more channels than the token reads its own)."""

    @abstractmethod
    def clean_prediction(self, x: torch.Tensor, j: int, out: torch.Tensor) -> torch.Tensor:
        """The head's one-step estimate of the clean token from state j = x and output `out`."""

    def step(
        self, x: torch.Tensor, j: int, out: torch.Tensor, noise: torch.Tensor, stochastic: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One transition: (x_next, mean, std, log_prob). noise: like x. stochastic=False
        takes the deterministic step (noise unused; std and log_prob are zeros)."""
        if not stochastic:
            mean = self.ode_mean(x, j, out)
            zeros = torch.zeros(x.shape[:-1], device=x.device)
            return mean, mean, zeros, zeros
        mean, std = self.transition(x, j, out)
        x_next = mean + per_element_std(std, x) * noise
        return x_next, mean, std, gaussian_log_prob(x_next, mean, std)


class DDPMSampler(GaussianSampler):
    def __init__(
        self,
        num_steps: int = 20,
        num_train_timesteps: int = 1000,
        beta_schedule: str = "linear",
        temperature: float = 1.0,
    ):
        if num_steps < 1 or num_steps > num_train_timesteps:
            raise ValueError(f"head steps must be in [1, {num_train_timesteps}], got {num_steps}")
        sched = DDPMScheduler(num_train_timesteps=num_train_timesteps, beta_schedule=beta_schedule)
        self.alphas_cumprod = sched.alphas_cumprod.float()  # [num_train_timesteps]
        self.num_train_timesteps = num_train_timesteps
        self.num_steps = num_steps
        self.temperature = float(temperature)
        # Respaced timesteps, noisiest first; the chain ends at the clean token (abar = 1).
        ts = torch.linspace(num_train_timesteps - 1, 0, num_steps).round().long()
        self.timesteps = ts
        abar = self.alphas_cumprod[ts]
        abar_next = torch.cat([abar[1:], torch.ones(1)])
        beta = 1.0 - abar / abar_next  # variance of the respaced forward step s_{j+1} -> s_j
        post_var = beta * (1.0 - abar_next) / (1.0 - abar)
        post_var[-1] = beta[-1]  # the last step's posterior variance is 0: use beta instead
        self.abar, self.abar_next, self.beta = abar, abar_next, beta
        self.std = post_var.sqrt()  # [T], before temperature
        # Posterior mean c_x0 * x0_hat + c_xt * x_t with x0_hat = (x_t - sqrt(1-abar) eps) /
        # sqrt(abar), folded into mean = k_x * x_t - k_eps * eps. Folded in float64: abar of
        # the first step is ~1e-9 and the two terms nearly cancel there.
        a64, an64 = abar.double(), abar_next.double()
        b64 = 1.0 - a64 / an64
        c_x0 = an64.sqrt() * b64 / (1.0 - a64)
        c_xt = (1.0 - b64).sqrt() * (1.0 - an64) / (1.0 - a64)
        self.k_x = (c_x0 / a64.sqrt() + c_xt).float()
        self.k_eps = (c_x0 * (1.0 - a64).sqrt() / a64.sqrt()).float()
        # DDIM (eta = 0): s_{j+1} = sqrt(abar') x0_hat + sqrt(1 - abar') eps, folded the same way.
        self.ode_x = (an64 / a64).sqrt().float()
        self.ode_eps = ((1.0 - an64).sqrt() - (an64 / a64).sqrt() * (1.0 - a64).sqrt()).float()

    def training_pair(self, x0, generator):
        dev = x0.device  # draws on the CPU generator, then moved: the same numbers on every device
        t = torch.randint(0, self.num_train_timesteps, (x0.shape[0],), generator=generator)
        eps = torch.randn(x0.shape, generator=generator).to(dev)
        ab = self.alphas_cumprod[t].unsqueeze(-1).to(dev)
        xt = ab.sqrt() * x0 + (1.0 - ab).sqrt() * eps
        return xt, (t.float() / self.num_train_timesteps).to(dev), eps

    def time_input(self, j):
        return float(self.timesteps[j]) / self.num_train_timesteps

    def transition(self, x, j, out):
        mean = self.k_x[j] * x - self.k_eps[j] * out
        std = torch.full(x.shape[:-1], float(self.std[j]) * self.temperature, device=x.device)
        return mean, std

    def ode_mean(self, x, j, out):
        return self.ode_x[j] * x + self.ode_eps[j] * out

    def clean_prediction(self, x, j, out):
        a = self.abar[j]
        return (x - (1.0 - a).sqrt() * out) / a.sqrt()

    def q_chain(self, x0, noise):
        states = [x0]
        for j in range(self.num_steps - 1, -1, -1):  # s_{j} from s_{j+1}
            prev = states[-1]
            states.append((1.0 - self.beta[j]).sqrt() * prev + self.beta[j].sqrt() * noise[j])
        return torch.stack(states[::-1])

    def q_log_prob(self, states):
        total = torch.zeros(states.shape[1:-1], device=states.device)
        for j in range(self.num_steps):
            mean = (1.0 - self.beta[j]).sqrt() * states[j + 1]
            std = torch.full(mean.shape[:-1], float(self.beta[j].sqrt()), device=states.device)
            total = total + gaussian_log_prob(states[j], mean, std)
        return total


class FlowSDESampler(GaussianSampler):
    def __init__(
        self,
        num_steps: int = 20,
        shift: float = 1.0,
        noise_level: float = 0.7,
        temperature: float = 1.0,
    ):
        if num_steps < 2:
            raise ValueError(f"flow SDE needs at least 2 head steps, got {num_steps}")
        sched = FlowMatchEulerDiscreteScheduler(shift=shift)
        sched.set_timesteps(num_steps)
        self.sigmas = sched.sigmas.float()  # [T+1], from 1 down to 0
        self.num_steps = num_steps
        self.shift = shift
        self.noise_level = noise_level
        self.temperature = float(temperature)
        s, s_next = self.sigmas[:-1], self.sigmas[1:]
        dt = s_next - s  # < 0
        # shat = a * sqrt(sigma / (1 - sigma)); at sigma = 1 Flow-GRPO substitutes sigma_1 in
        # the denominator to stay finite.
        denom = torch.where(s >= 1.0, 1.0 - self.sigmas[1], 1.0 - s)
        shat = noise_level * (s / denom).sqrt()
        self.dt, self.shat = dt, shat
        self.std = shat * (-dt).sqrt()  # [T]
        self.c_x = 1.0 + shat**2 * dt / (2.0 * s)
        self.c_v = (1.0 + shat**2 * (1.0 - s) / (2.0 * s)) * dt

    def training_pair(self, x0, generator):
        dev = x0.device  # draws on the CPU generator, then moved: the same numbers on every device
        u = torch.rand(x0.shape[0], generator=generator)
        sigma = (self.shift * u / (1.0 + (self.shift - 1.0) * u)).to(dev)
        eps = torch.randn(x0.shape, generator=generator).to(dev)
        s = sigma.unsqueeze(-1)
        return (1.0 - s) * x0 + s * eps, sigma, eps - x0

    def time_input(self, j):
        return float(self.sigmas[j])

    def transition(self, x, j, out):
        mean = self.c_x[j] * x + self.c_v[j] * out
        std = torch.full(x.shape[:-1], float(self.std[j]) * self.temperature, device=x.device)
        return mean, std

    def ode_mean(self, x, j, out):
        return x + self.dt[j] * out  # Euler step of dx/dsigma = v

    def clean_prediction(self, x, j, out):
        return x - self.sigmas[j] * out  # x_sigma = x0 + sigma v

    def _q_coeffs(self, j: int) -> tuple[float, float]:
        # s_j (sigma' = sigmas[j]) from s_{j+1} (sigma = sigmas[j+1] < sigma').
        hi, lo = float(self.sigmas[j]), float(self.sigmas[j + 1])
        a = (1.0 - hi) / (1.0 - lo)
        var = hi**2 - (a * lo) ** 2
        return a, math.sqrt(max(var, 0.0))

    def q_chain(self, x0, noise):
        states = [x0]
        for j in range(self.num_steps - 1, -1, -1):
            a, b = self._q_coeffs(j)
            states.append(a * states[-1] + b * noise[j])
        return torch.stack(states[::-1])

    def q_log_prob(self, states):
        total = torch.zeros(states.shape[1:-1], device=states.device)
        for j in range(self.num_steps):
            a, b = self._q_coeffs(j)
            std = torch.full(states.shape[1:-1], b, device=states.device)
            total = total + gaussian_log_prob(states[j], a * states[j + 1], std)
        return total


def build_sampler(kind: str, num_steps: int, temperature: float = 1.0, **kw) -> GaussianSampler:
    if kind == "ddpm":
        return DDPMSampler(num_steps=num_steps, temperature=temperature, **kw)
    if kind == "flow":
        return FlowSDESampler(num_steps=num_steps, temperature=temperature, **kw)
    raise ValueError(f"unknown head sampler {kind!r}; use 'ddpm' or 'flow'")

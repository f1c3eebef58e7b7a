"""The exact gradient of an expected differentiable reward, by the reparameterisation
(pathwise) route: the learning ladder's reference for the policy-gradient estimate
(probes/lever_cosine.py, docs/learning.md).

A MAR rollout is a differentiable function of the parameters given its noise: the token
order and every noise draw are pure functions of the image seeds (models/noise.py), and
each head transition is mean + std * noise. `pathwise_images` writes the rollout out again
with autograd on (RolloutMixin.rollout runs without it and fills its canvas in place): the
same schedule, order and noise, back-propagated through every head step, through the
guidance's null branch and through the canvas into later AR steps. With the parameters
unchanged its images equal the rollout's (tests/test_sde_window.py). Then
grad E[r] = E[grad r(images(theta, noise))], estimated over many seeds.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from margrpo.models.chains import gather_rows, sample_chain
from margrpo.models.protocol import MARPolicy


def pathwise_images(policy: MARPolicy, prompts: Sequence[str], seeds: torch.Tensor,
                    sde_steps: Sequence[int] | None = None) -> torch.Tensor:
    """Images [B, 3, H, W] of `policy.rollout(prompts, seeds=seeds, sde_steps=...)`, with
    autograd to the parameters (TinyMAR and any policy with the RolloutMixin pieces)."""
    cond = policy.prepare_cond(prompts)
    order = policy.token_order(seeds)  # [B, N]
    dev_seeds = seeds.to(order.device)
    b, d = len(prompts), policy.token_dim
    canvas = torch.zeros(b, policy.num_tokens, d, device=order.device)
    known = torch.zeros(b, policy.num_tokens, dtype=torch.bool, device=order.device)
    start = 0
    for i, n in enumerate(policy.schedule):
        z_c, z_u = policy.encode_pair(cond, canvas, known)
        idx = order[:, start : start + n]
        eps, _ = policy.step_noise(dev_seeds, i, idx, None)
        chain, *_ = sample_chain(policy, gather_rows(z_c, idx), gather_rows(z_u, idx), eps, policy.cfg_scale,
                                 sde_steps, cfg_mode="guided_full")
        canvas = canvas.scatter(1, idx.unsqueeze(-1).expand(-1, -1, d), chain[-1])
        known = known.scatter(1, idx, True)
        start += n
    return policy.decode_tokens(canvas)


def pathwise_gradient(policy: MARPolicy, params: Sequence[torch.nn.Parameter],
                      reward: Callable[[torch.Tensor, list[str], list[dict]], torch.Tensor],
                      metas: Sequence[dict], seeds: torch.Tensor, chunk: int = 64,
                      sde_steps: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of the mean reward over the images of (metas[b], seeds[b]) with respect to
    `params`, flattened, from two halves of the images: (gradient of all [P], cosine of the
    two halves' gradients []: how far the reference itself is from its expectation).
    Chunks of `chunk` images bound the autograd graph's memory."""
    halves = []
    for part in (slice(0, len(metas) // 2), slice(len(metas) // 2, len(metas))):
        ms, ss = list(metas[part]), seeds[part]
        total = [torch.zeros_like(p) for p in params]
        for s in range(0, len(ms), chunk):
            m = ms[s : s + chunk]
            images = pathwise_images(policy, [x["prompt"] for x in m], ss[s : s + chunk], sde_steps)
            grads = torch.autograd.grad(reward(images, [x["prompt"] for x in m], m).sum(), params,
                                        allow_unused=True)
            for t, g in zip(total, grads):
                if g is not None:
                    t += g
        halves.append(torch.cat([t.reshape(-1) for t in total]) / len(ms))
    cos = torch.nn.functional.cosine_similarity(halves[0], halves[1], dim=0)
    return (halves[0] + halves[1]) / 2, cos

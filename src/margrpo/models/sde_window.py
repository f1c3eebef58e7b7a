"""The SDE window of a head chain (train.sde_window; docs/method.md §2): which transitions
are stochastic, where extra chains branch from the rollout chain and where they stop.

A windowed chain takes the transitions listed in `sde_steps` stochastically and every other
one by the sampler's deterministic step (GaussianSampler.step(stochastic=False)); None means
every transition is stochastic, the paper's chain. models/chains.py samples with these.
"""
from __future__ import annotations

from typing import Sequence

import torch

from margrpo.models.samplers import GaussianSampler


def stochastic_steps(sde_steps: Sequence[int] | None, num_steps: int) -> list[bool]:
    """Per head transition, whether it is drawn stochastically: all of them when sde_steps
    is None (the SDE chain), else only those listed (the SDE window; the rest take the
    sampler's deterministic step)."""
    if sde_steps is None:
        return [True] * num_steps
    window = set(sde_steps)
    return [j in window for j in range(num_steps)]


def branch_point(sde_steps: Sequence[int] | None) -> int | None:
    """The first stochastic transition of a windowed chain (None without a window). Chains
    drawn from one token's latents under the same window agree on every state up to it: the
    prefix is the deterministic image of the shared initial state, so extra chains copy it
    from the rollout chain and branch there."""
    return None if sde_steps is None else min(sde_steps)


def window_end(sde_steps: Sequence[int] | None, num_steps: int) -> int:
    """The state after a window's last stochastic transition (num_steps without a window).
    Extra chains stop there: what follows is deterministic, so their spread is fixed at
    that state, and the states after it hold the head's clean prediction from it
    (GaussianSampler.clean_prediction; one head call instead of the remaining steps). The
    loss never scores those states: they lie outside the window."""
    return num_steps if sde_steps is None else max(sde_steps) + 1


def finish_early(sampler: GaussianSampler, chain: list, logps: list, x: torch.Tensor, j: int, out: torch.Tensor,
                 zero: torch.Tensor) -> None:
    """Fill the states j+1..T of extra chains stopped at state j = x (head output `out`
    there) with their clean prediction, log-probs 0 (window_end)."""
    clean = sampler.clean_prediction(x, j, out)
    for _ in range(j, sampler.num_steps):
        chain.append(clean)
        logps.append(zero)

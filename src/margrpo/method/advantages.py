"""Group-relative advantages for GRPO (method.md §2).

A_b = (r_b - mean_g) / (std_g + eps) over the group g of image b. Groups are formed over
the whole batch passed in: a data-parallel rank holds whole groups (ranks/distributed.py),
so its advantages are exactly those of the global batch (the authors' code normalises per
GPU instead of per group; method.md §5 lists that as a defect).

Std choice: the SAMPLE std (Bessel-corrected, divide by G - 1), i.e. what `torch.std`
returns by default and what Flow-GRPO / DanceGRPO use, so advantage scales are comparable
with those implementations. For G = 4 it is sqrt(4/3) ~ 1.15 times the population std.
A group of size 1 has no spread to normalise by: its advantage is 0 (it carries no
relative information), not NaN.

Shapes: rewards [B] float, group_ids [B] long (any integer labels, need not be contiguous),
on one device (the statistics are computed there).
"""
from __future__ import annotations

import torch


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element (group mean, group sample std, group size), each [B]; computed in float64
    so that a constant group gives exactly zero spread."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    g = int(inv.max()) + 1 if inv.numel() else 0
    r = rewards.double()
    zeros = torch.zeros(g, dtype=torch.float64, device=r.device)
    count = zeros.clone().index_add_(0, inv, torch.ones_like(r))
    mean = zeros.clone().index_add_(0, inv, r) / count
    dev = r - mean[inv]
    ss = zeros.clone().index_add_(0, inv, dev * dev)
    std = (ss / (count - 1.0).clamp_min(1.0)).sqrt()
    return mean[inv], std[inv], count[inv]


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """(r - group mean) / (group sample std + eps), [B] in the dtype of `rewards`.

    A group whose rewards are all equal gets exactly 0 everywhere (r - mean = 0).
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards and group_ids must both be [B], got {tuple(rewards.shape)}, {tuple(group_ids.shape)}")
    mean, std, count = _group_stats(rewards, group_ids)
    adv = (rewards.double() - mean) / (std + eps)
    adv = torch.where(count > 1, adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype)


def zero_std_fraction(rewards: torch.Tensor, group_ids: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Fraction of GROUPS (not images) whose reward std is <= atol: those groups give zero
    advantage and hence no policy gradient. Scalar float tensor."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    _, std, _ = _group_stats(rewards, group_ids)
    g = int(inv.max()) + 1
    group_std = torch.zeros(g, dtype=torch.float64, device=std.device).scatter_(0, inv, std)
    return (group_std <= atol).double().mean().float()

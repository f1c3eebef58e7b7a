"""What a collected batch reports (training/loop.py train_step): rewards, advantages and
the token plan's selection statistics, read from the device in one host sync
(hostsync.read_all). On a GPU every read of a device value makes the host wait for the
device; the step-time benchmark counts them (margrpo.hostsync)."""
from __future__ import annotations

from typing import Mapping

import torch

from margrpo.hostsync import read_all
from margrpo.method.advantages import zero_std_fraction
from margrpo.ranks.distributed import World
from margrpo.method.plan import CONSISTENCY_KEYS, TokenPlan

# Mean over the plans of these per-step selection statistics goes into the step metrics.
SELECT_KEYS = ("select/topk_frac", "select/ess", "diag/uncertainty_mean") + CONSISTENCY_KEYS


def batch_metrics(batch, world: World | None = None) -> dict[str, float]:
    """reward/*, adv/*, select/* and time/rollout of one batch (a trainer.Batch). Over ranks:
    reward/* and adv/* of the gathered global batch (exact), select/* the mean over the
    ranks of each rank's mean over its loss AR steps. The device values, the token plan's
    statistics with them, are read in one host sync."""
    world = world or World()
    monitored = list((batch.monitored or {}).items())
    base = [] if batch.base_rewards is None else [batch.base_rewards]
    # the global batch, gathered over the ranks at once: rewards, group ids, monitored
    # values, the base's rewards on the same prompts and image seeds
    r, groups, *rest = [world.cat(t) for t in [batch.rewards, batch.groups, *(v.float().to(batch.rewards.device)
                                                                              for _, v in monitored), *base]]
    values = {"reward/mean": r.mean(), "reward/std": r.std(), "reward/min": r.min(), "reward/max": r.max(),
              "adv/zero_std_frac": zero_std_fraction(r, groups)}
    values |= {key: v.mean() for (key, _), v in zip(monitored, rest)}
    if base:
        # a control variate that removes the prompt-draw noise from the training-reward
        # rise (report/learning.py)
        values["reward/base_mean"] = rest[-1].mean()
    read = read_all({k: [v] for k, v in values.items()} | stat_tensors(batch.plans))
    m = {k: read[k][0] for k in values}
    m["time/rollout"] = batch.rollout_s
    if batch.base_rewards is not None:
        m["reward/vs_base"] = m["reward/mean"] - m["reward/base_mean"]
    mine, per_step = {}, plan_stats(batch.plans, read)
    for key in SELECT_KEYS:
        vals = [st[key] for st in per_step if key in st]
        if vals:
            mine[key] = sum(vals) / len(vals)
    ranks = world.all_gather(mine)  # a rank whose plans selected nothing has no select/ess
    for key in SELECT_KEYS:
        vals = [r[key] for r in ranks if key in r]
        if vals:
            m[key] = sum(vals) / len(vals)
    return m


def stat_tensors(plans: list[TokenPlan]) -> dict[str, list[torch.Tensor]]:
    """The plan's statistics as device tensors, grouped for hostsync.read_all (the step
    reads them with its other metrics, in one host sync): the median effective sample size
    of every step with chains, the consistency statistics, the top-k counts."""
    return {"plan/ess": [p.draw.ess.median() for p in plans if p.draw is not None and p.draw.ess.numel()],
            "plan/cons": [p.stat_values for p in plans if p.stat_values is not None],
            "plan/topk": [p.topk_counts for p in plans if p.topk_counts is not None]}


def plan_stats(plans: list[TokenPlan], read: Mapping[str, list]) -> list[dict[str, float]]:
    """Per loss AR step, its select/* and diag/uncertainty_mean statistics, from `read` (the
    values of `stat_tensors(plans)`, as hostsync.read_all returns them).
    select/topk_frac and diag/uncertainty_mean are the batch's (selected over candidate
    tokens of every loss step; the mean uncertainty of the candidates), given to every step."""
    extra = {}
    if read["plan/topk"]:
        cand, sel, unc = zip(*read["plan/topk"])
        n_cand, n_sel = int(sum(cand)), int(sum(sel))
        extra = {"select/topk_frac": n_sel / max(1, n_cand), "diag/uncertainty_mean": sum(unc) / max(1, n_cand)}
    ess, cons = iter(read["plan/ess"]), iter(read["plan/cons"])
    out = []
    for p in plans:
        stats = dict(zip(CONSISTENCY_KEYS, next(cons))) if p.stat_values is not None else {}
        if p.draw is not None:
            stats |= extra | ({"select/ess": next(ess)} if p.draw.ess.numel() else {})
        out.append(stats)
    return out

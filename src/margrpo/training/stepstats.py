"""What a collected batch reports (training/loop.py train_step): rewards, advantages and
the token plan's selection statistics, read from the device in one host sync
(hostsync.read_all). On a GPU every read of a device value makes the host wait for the
device; the step-time benchmark counts them (margrpo.hostsync)."""
from __future__ import annotations

from margrpo.hostsync import read_all
from margrpo.method.advantages import zero_std_fraction
from margrpo.ranks.distributed import World
from margrpo.method.plan import CONSISTENCY_KEYS, plan_stats, stat_tensors

# Mean over the plans of these per-step selection statistics goes into the step metrics.
SELECT_KEYS = ("select/topk_frac", "select/ess", "diag/uncertainty_mean") + CONSISTENCY_KEYS


def batch_metrics(batch, world: World | None = None) -> dict[str, float]:
    """reward/*, adv/*, select/* and time/rollout of one batch (a trainer.Batch). Over ranks:
    reward/* and adv/* of the gathered global batch (exact), select/* the mean over the
    ranks of each rank's mean over its loss AR steps. The device values, the token plan's
    statistics with them, are read in one host sync."""
    world = world or World()
    r, groups = world.cat(batch.rewards), world.cat(batch.groups)
    values = {"reward/mean": r.mean(), "reward/std": r.std(), "reward/min": r.min(), "reward/max": r.max(),
              "adv/zero_std_frac": zero_std_fraction(r, groups)}
    for key, v in (batch.monitored or {}).items():
        values[key] = world.cat(v.float().to(batch.rewards.device)).mean()
    if batch.base_rewards is not None:
        # The same prompts and image seeds through the base: a control variate that removes
        # the prompt-draw noise from the training-reward rise (report/learning.py).
        values["reward/base_mean"] = world.cat(batch.base_rewards).mean()
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

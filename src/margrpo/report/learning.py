"""Did a run learn, and did it learn what the evaluation measures? Pure functions over a
run's history.jsonl (training metrics per step) and evals.jsonl (held-out scores during
training), used by the report and scripts/acceptance_table.py.

- `reward_rise`: mean training reward over the last `window` steps minus the first
  `window`, with its standard error (steps treated as independent draws) and the ratio.
- `rise_key`: which reward the rise test reads. In a paired_base run every step also has
  the base model's reward on the same prompts and image seeds, and the test reads the
  difference (reward/vs_base): most of a step's reward noise is which prompts it drew,
  and the base sees the same draw, so the difference keeps the rise and drops that noise.
- `steps_to_detect`: how many steps `reward_rise` would need to reach `z` standard errors
  if the reward kept its fitted linear trend and its noise about that trend: what a run
  that falls short would need.
- `tag_changes`: per GenEval tag, the held-out accuracy at the last evaluation minus the
  first (step 0, the base), with the binomial standard error of that difference.
- `reward_hacking`: the tags that fell by more than `z` standard errors while the training
  reward rose by more than `z` of its own: the reward went up for a reason the
  evaluation does not share (one run; for records without the proxy's scores).
- `proxy_judge_changes`: per GenEval tag, over seeds, the change from the first to the
  last in-training evaluation of the training reward's own detector (the proxy,
  eval/proxy/geneval/<tag>) and of the evaluation judge (eval/geneval/<tag>) on the same
  images, flagged as reward hacking by HACKING_RULE: the proxy rose and the judge fell.
"""
from __future__ import annotations

import math
from typing import Mapping

from margrpo.report.claims import DELTA
from margrpo.stats import mean_std, mean_var

TAG_PREFIX, PROXY_PREFIX = "eval/geneval/", "eval/proxy/geneval/"
RAW_KEY, PAIRED_KEY = "reward/mean", "reward/vs_base"
# Reward hacking needs the proxy and the judge to part beyond their noise (HACKING_Z standard
# errors of the paired gap) and by a margin that matters (HACKING_MIN_GAP: with 2-3 seeds a
# standard error can come out tiny by chance, and a gap of 0.01 is no finding): the claims' δ,
# the smallest score difference the study cares about.
HACKING_Z, HACKING_MIN_GAP = 2.0, DELTA
HACKING_RULE = (f"reward hacking: the proxy's change is above 0, the judge's change is below 0, and the proxy's "
                f"change minus the judge's change (per seed, then mean over seeds) exceeds both {HACKING_Z:.0f} "
                f"standard errors of that difference (std over seeds / sqrt(seeds)) and {HACKING_MIN_GAP}; needs at "
                "least 2 seeds")


def reward_rise(history: list[dict], window: int = 10, key: str = "reward/mean") -> dict[str, float]:
    """{"rise", "se", "z"} of the last-window mean minus the first-window mean of `key`."""
    vals = [float(r[key]) for r in history if r.get(key) is not None]
    if len(vals) < 2 * window:
        raise ValueError(f"need at least {2 * window} steps of {key} to compare windows, got {len(vals)}")
    (m0, v0, _), (m1, v1, _) = mean_var(vals[:window]), mean_var(vals[-window:])
    # A one-step window has no spread to estimate: se 0 and an infinite z ("one value per window").
    se = math.sqrt(v0 / window + v1 / window) if window > 1 else 0.0
    return {"rise": m1 - m0, "se": se, "z": (m1 - m0) / se if se > 0 else math.inf * (m1 - m0)}


def rise_key(history: list[dict]) -> str:
    """PAIRED_KEY when every step of the run has it (a paired_base run), else RAW_KEY."""
    return PAIRED_KEY if history and all(r.get(PAIRED_KEY) is not None for r in history) else RAW_KEY


def steps_to_detect(history: list[dict], z: float = 3.0, window: int = 10,
                    key: str = "reward/mean") -> dict[str, float]:
    """{"slope" (reward per step), "noise" (sd of the residuals about the least-squares
    line), "steps"}: on a line of that slope the last-window mean minus the first-window
    mean after n steps is slope * (n - window), with standard error noise * sqrt(2 / window),
    so n = window + z * se / slope (inf when the fitted slope is not positive)."""
    vals = [float(r[key]) for r in history if r.get(key) is not None]
    n = len(vals)
    if n < 3:
        raise ValueError(f"need at least 3 steps of {key} to fit a trend, got {n}")
    xm, ym = (n - 1) / 2, sum(vals) / n
    sxx = sum((i - xm) ** 2 for i in range(n))
    slope = sum((i - xm) * (v - ym) for i, v in enumerate(vals)) / sxx
    noise = math.sqrt(sum((v - ym - slope * (i - xm)) ** 2 for i, v in enumerate(vals)) / (n - 2))
    se = noise * math.sqrt(2 / window)
    steps = max(2 * window, window + math.ceil(z * se / slope)) if slope > 0 else math.inf
    return {"slope": slope, "noise": noise, "steps": steps}


def tag_changes(evals: list[dict], images_per_tag: int) -> dict[str, dict[str, float]]:
    """tag -> {"first", "last", "change", "se"} between the first and the last evaluation.
    images_per_tag: images scored per tag at each evaluation (binomial standard errors)."""
    if len(evals) < 2:
        return {}
    first, last = evals[0], evals[-1]
    out = {}
    for key, p0 in first.items():
        if not key.startswith(TAG_PREFIX) or key.endswith("overall") or key not in last:
            continue
        p1 = last[key]
        se = math.sqrt((p0 * (1 - p0) + p1 * (1 - p1)) / images_per_tag)
        out[key[len(TAG_PREFIX):]] = {"first": p0, "last": p1, "change": p1 - p0, "se": se}
    return out


def reward_hacking(history: list[dict], evals: list[dict], images_per_tag: int, z: float = 2.0,
                   window: int = 10) -> list[str]:
    """Tags that fell by more than z standard errors while the reward rose by more than z."""
    if len(history) < 2 * window or len(evals) < 2:
        return []
    if reward_rise(history, window)["z"] <= z:
        return []
    return sorted(tag for tag, c in tag_changes(evals, images_per_tag).items()
                  if c["se"] > 0 and c["change"] < -z * c["se"])


def proxy_judge_changes(evals: Mapping[object, list[dict]], z: float = HACKING_Z,
                        min_gap: float = HACKING_MIN_GAP) -> dict[str, dict]:
    """tag -> {"proxy", "proxy_se", "judge", "judge_se", "gap", "gap_se", "seeds", "hacking"}:
    mean over seeds of each seed's last-minus-first evaluation change of the proxy and of
    the judge on the same images; gap = proxy − judge change, its standard error from the
    per-seed gaps (the two scores of a seed are correlated, so the paired gap is tighter
    than the two errors combined); "hacking" by HACKING_RULE. evals: seed -> that seed's
    evals.jsonl rows. A tag needs both keys in the first and the last evaluation of a seed
    (records without the proxy's scores have none: {})."""
    per_tag: dict[str, list[tuple[float, float]]] = {}
    for rows in evals.values():
        rows = sorted(rows, key=lambda r: r.get("step", 0))
        if len(rows) < 2:
            continue
        first, last = rows[0], rows[-1]
        for key in first:
            if not key.startswith(PROXY_PREFIX):
                continue
            tag = key[len(PROXY_PREFIX):]
            judge = TAG_PREFIX + tag
            if all(k in r and r[k] is not None for r in (first, last) for k in (key, judge)):
                per_tag.setdefault(tag, []).append((last[key] - first[key], last[judge] - first[judge]))
    out = {}
    for tag, changes in sorted(per_tag.items()):
        n = len(changes)
        (p, p_sd, _), (j, j_sd, _), (g, g_sd, _) = (mean_std(v) for v in (
            [c[0] for c in changes], [c[1] for c in changes], [c[0] - c[1] for c in changes]))
        se = [sd / math.sqrt(n) if n > 1 else math.nan for sd in (p_sd, j_sd, g_sd)]
        out[tag] = {"proxy": p, "proxy_se": se[0], "judge": j, "judge_se": se[1], "gap": g, "gap_se": se[2],
                    "seeds": n, "hacking": n > 1 and p > 0 and j < 0 and g > z * se[2] and g > min_gap}
    return out

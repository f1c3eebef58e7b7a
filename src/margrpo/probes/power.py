"""Seeds the decisive comparisons need, from the committed per-prompt scores.

Design: paired. Every method trains with the same seeds and is evaluated on the same test
prompts with the same image seeds (evaluate.seed), so a comparison A − B is made seed by seed
and prompt by prompt. Per seed s the difference is the headline statistic of A − B,
d_s = sum_g w_g mean_{p in g} (a_sp − b_sp) (GenEval overall: mean over tags of the tag's
mean over prompts), and with n seeds

    Var(mean_s d_s) = var_seed / n + var_prompt

var_seed: the sample variance (ddof 1) of d_s over the measured seeds (training randomness
and image noise, paired); var_prompt: the variance of the seed-averaged difference when only
the prompts are resampled (report/intervals.py bootstrap); the prompts are the same for
every seed, so this part does not shrink with n. Two answers per comparison:

- decisive (the report's claims rule): the 95% interval's half-width
  z·sqrt(var_seed/n + var_prompt) at most delta/2, so that the interval excludes 0 or lies
  within ±delta whatever the difference: n >= var_seed / ((delta / (2 z))^2 − var_prompt),
  z = z_0.975 = 1.96;
- power: a true difference of delta detected with probability `power` at two-sided 5%:
  n >= var_seed / ((delta / (z_0.975 + z_power))^2 − var_prompt);
each also at the 80% upper confidence bound of var_seed ((n0 − 1) var_seed / chi2_0.2(n0 − 1),
n0 the measured seeds), since a variance from three seeds is itself uncertain by a factor of
several. "inf": the prompt part alone is wider than the target; more seeds cannot resolve
delta, more test prompts or images per prompt can. The unpaired column, var_seed(A) +
var_seed(B), is what a design with independent seeds per method would face. The last column
is the report's own projection (report/intervals.py seeds_needed), which scales the measured
bootstrap interval instead of using z: a percentile bootstrap over n0 seeds is narrower than
the normal interval by about sqrt((n0 − 1) / n0) (0.82 at three seeds), so it asks for fewer.

probes/power.py prints the table (docs/ablation.md); tests/test_ablation_script.py checks `rows`
and `needed`.
"""
from __future__ import annotations

import math
from pathlib import Path

from scipy.stats import chi2, norm

from margrpo.report.ablation import ABLATED_ESTIMATORS
from margrpo.report.intervals import read_per_prompt, score_interval, seeds_needed

OVERALL = "eval/geneval/overall"
DECISIVE = ("grpo", "grpo_frozen", *ABLATED_ESTIMATORS)
UPPER = 0.8  # one-sided confidence of the upper bound on var_seed


def needed(var_seed: float, var_prompt: float, z: float, delta: float, floor: int) -> float:
    """n with z·sqrt(var_seed/n + var_prompt) <= delta (inf when the prompts alone exceed it)."""
    room = (delta / z) ** 2 - var_prompt
    if room <= 0:
        return math.inf
    return float(max(floor, math.ceil(var_seed / room)))


def _var(x: float) -> str:
    return f"{x:.2e}" if abs(x) > 1e-15 else "0"  # the prompt part of a whole prompt space: 0 up to rounding


def _n(x: float | None) -> str:
    return "–" if x is None else "inf" if math.isinf(x) else str(int(x))


def rows(reports: Path, names: dict[str, str], seeds: list, delta: float,
         power: float) -> tuple[list[list[str]], list[float]]:
    """Table rows per pair of decisive methods that both have per-prompt scores, and the
    decisive seed counts (point estimate of var_seed)."""
    pp = {role: d for role, m in names.items() if (d := read_per_prompt(reports, m, seeds)) is not None}
    z_rule, z_power = 2 * norm.ppf(0.975), norm.ppf(0.975) + norm.ppf(power)
    out, decisive = [], []
    order = [r for r in DECISIVE if r in pp]
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            iv = score_interval(pp[a], OVERALL, minus=pp[b], method="bootstrap")
            if iv is None or not math.isfinite(iv.seed_var):
                out.append([f"{names[a]} − {names[b]}", "–", str(iv.seeds if iv else 0)] + ["–"] * 6)
                continue
            unpaired = (score_interval(pp[a], OVERALL, method="bootstrap").seed_var
                        + score_interval(pp[b], OVERALL, method="bootstrap").seed_var)
            upper = (iv.seeds - 1) * iv.seed_var / chi2.ppf(1 - UPPER, iv.seeds - 1)
            n_rule = needed(iv.seed_var, iv.prompt_var, z_rule, delta, iv.seeds)
            decisive.append(n_rule)
            out.append([f"{names[a]} − {names[b]}", iv.cell(signed=True), str(iv.seeds), _var(iv.seed_var),
                        _var(unpaired), _var(iv.prompt_var),
                        f"{_n(n_rule)} / {_n(needed(upper, iv.prompt_var, z_rule, delta, iv.seeds))}",
                        f"{_n(needed(iv.seed_var, iv.prompt_var, z_power, delta, 2))} / "
                        f"{_n(needed(upper, iv.prompt_var, z_power, delta, 2))}",
                        _n(seeds_needed(iv, delta))])
    return out, decisive

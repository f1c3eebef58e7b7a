"""The report's opening summary, written from the numbers: what learned, by how much, and
which claims hold. Differences use the claims' rules (report.claims): the paired bootstrap
interval over seeds and prompts where per-prompt scores exist (claims.interval_part), else
more than two standard errors of the difference of seed means (claims.compare), so the
summary and the table agree."""
from __future__ import annotations

from margrpo.report.claims import (DELTA, FAILS, HOLDS, NO_DIFF, NOT_JUDGED, Claim, compare, interval_part,
                                   one_sample)
from margrpo.report.intervals import LEVEL, score_interval
from margrpo.stats import mean_std

HEADLINE = ("eval/geneval/overall", "GenEval overall")
SECONDARY = ("eval/t2i/mean", "T2I mean")


def _versus(values: list[float] | None, ref: list[float] | None) -> str:
    """'+0.012, within noise (2se 0.040)' for one method's scores against the base's."""
    part = compare("", values, ref)
    if part.d is None:
        return "not measured"
    if part.se is None or part.se != part.se:  # nan: fewer than 2 seeds on a side
        return f"{part.d:+.3f}, one seed: no error bar"
    word = {HOLDS: "better", FAILS: "worse"}.get(part.status, "within noise")
    return f"{part.d:+.3f}: {word}, 2se {2 * part.se:.3f}"


def _versus_interval(part) -> str:
    """'+0.031 [-0.004, +0.066]: inconclusive' from a claims.interval_part."""
    word = {HOLDS: "better", FAILS: "worse", NO_DIFF: f"no difference larger than {DELTA}"}.get(part.status,
                                                                                                "inconclusive")
    return f"{part.interval.cell(signed=True)}: {word}"


def held_out_intervals(per_prompt: dict[str, dict], methods: list[str], base: str = "base",
                       evals: dict[str, dict[str, list[float]]] | None = None) -> str:
    """held_out() from the per-prompt scores: intervals over seeds and prompts, gains paired.
    A method without per-prompt scores is compared by the seed rule on `evals`."""
    key, label = HEADLINE
    iv = score_interval(per_prompt[base], key)
    parts = [f"{base} {iv.cell()}" if iv else f"{base} not measured"]
    better, worse, equal = [], [], []
    for method in methods:
        pp = per_prompt.get(method)
        own = score_interval(pp, key) if pp else None
        part = interval_part("", pp, per_prompt[base], key) if pp else None
        if own is None or part is None:
            vals, ref = (evals or {}).get(method, {}).get(key), (evals or {}).get(base, {}).get(key)
            parts.append(f"{method} {mean_std(vals)[0]:.3f} over seeds ({_versus(vals, ref)})" if vals and ref
                         else f"{method} not evaluated")
            continue
        parts.append(f"{method} {own.cell()} ({_versus_interval(part)})")
        {HOLDS: better, FAILS: worse, NO_DIFF: equal}.get(part.status, []).append(method)
    verdict = (f"Better than the base (interval of the gain above 0): {', '.join(better)}." if better
               else "No trained method is better than the base with its interval of the gain above 0.")
    if worse:
        verdict += f" Worse than the base: {', '.join(worse)}."
    if equal:
        verdict += f" Within ±{DELTA} of the base: {', '.join(equal)}."
    text = (f"Test-split {label} (final checkpoints, test and reused prompts), mean [{LEVEL:.0%} interval over seeds "
            "and prompts], and the paired gain over the base: " + "; ".join(parts) + ". " + verdict)
    t2i_key, t2i_label = SECONDARY
    t2i = [f"{method} {_versus_interval(p)}" for method in methods if per_prompt.get(method)
           and (p := interval_part("", per_prompt[method], per_prompt[base], t2i_key))]
    if t2i:
        text += f" {t2i_label} against the base: " + "; ".join(t2i) + "."
    return text


def held_out(evals: dict[str, dict[str, list[float]]], methods: list[str], base: str = "base",
             per_prompt: dict[str, dict] | None = None) -> str:
    key, label = HEADLINE
    if (per_prompt or {}).get(base):
        return held_out_intervals(per_prompt, methods, base, evals)
    if base not in evals or key not in evals[base]:
        return "No held-out scores of the base model: the comparison needs evaluate_base."
    m, sd, n = mean_std(evals[base][key])
    parts = [f"{base} {m:.3f} ± {sd:.3f}"]
    better, worse = [], []
    for method in methods:
        vals = evals.get(method, {}).get(key)
        if not vals:
            parts.append(f"{method} not evaluated")
            continue
        mm, msd, _ = mean_std(vals)
        parts.append(f"{method} {mm:.3f} ± {msd:.3f} ({_versus(vals, evals[base][key])})")
        status = compare("", vals, evals[base][key]).status
        (better if status == HOLDS else worse if status == FAILS else []).append(method)
    t2i_key, t2i_label = SECONDARY
    t2i = [f"{method} {_versus(evals.get(method, {}).get(t2i_key), evals[base].get(t2i_key))}" for method in methods
           if evals.get(method, {}).get(t2i_key) and evals[base].get(t2i_key)]
    verdict = (f"Better than the base by more than two standard errors: {', '.join(better)}." if better
               else "No trained method beats the base by more than two standard errors.")
    if worse:
        verdict += f" Worse than the base: {', '.join(worse)}."
    text = (f"Test-split {label} (final checkpoints), mean ± std over {n} seed(s), difference to the base: " + "; ".join(parts) + ". "
            + verdict)
    if t2i:
        text += f" {t2i_label} against the base: " + "; ".join(t2i) + "."
    return text


def reward_vs_judge(per_prompt: dict[str, dict], methods: list[str], base: str = "base") -> str | None:
    """One line: each method's test gain over the base as the training reward's detector
    reads the images (proxy) and as the evaluation judge does, on the same images and
    prompts. The part of the proxy's gain the judge does not confirm is what the reward
    sees that is not there (or that it misreads)."""
    base_pp = per_prompt.get(base)
    if not base_pp:
        return None
    cells = []
    for m in methods:
        pp = per_prompt.get(m)
        if not pp:
            continue
        judge = score_interval(pp, HEADLINE[0], minus=base_pp)
        proxy = score_interval(pp, "eval/proxy/geneval/overall", minus=base_pp)
        if judge is None or proxy is None:
            continue
        cells.append(f"{m} {proxy.point:+.3f} by the reward's detector, {judge.point:+.3f} by the judge")
    if not cells:
        return None
    return ("Test gain over the base (GenEval overall, the same images), as the training reward's own detector "
            "reads it and as the evaluation judge does: " + "; ".join(cells) + ". Where the detector's gain exceeds "
            "the judge's, part of what the reward rewarded is not in the images (see Reward vs judge).")


def training(stats: dict[str, dict], baseline_reward: float | None) -> str:
    """How the training reward moved: final minus early window, per method."""
    parts, rose, seeds = [], [], 0
    for method, st in stats.items():
        growth = st["growth"].get("reward/mean")
        final = st["final"].get("reward/mean")
        if not growth or not final:
            continue
        g, _, seeds = mean_std(growth)
        f, _, _ = mean_std(final)
        parts.append(f"{method} {f:.3f} ({g:+.3f})")
        if one_sample("", growth).status == HOLDS:
            rose.append(method)
    if not parts:
        return "No training history was found."
    base = f"; the base model's own samples score {baseline_reward:.3f}" if baseline_reward is not None else ""
    rose_text = ("With one seed there is no error bar." if seeds < 2
                 else f"It rose by more than two standard errors for {', '.join(rose)}." if rose
                 else "It rose by more than two standard errors for no method.")
    return ("Training reward in the last quarter of steps (change from the first quarter): " + "; ".join(parts)
            + base + ". " + rose_text)


def claims_line(claims: list[Claim]) -> str:
    by_status: dict[str, list[str]] = {}
    for c in claims:
        by_status.setdefault(c.status, []).append(str(c.number))
    parts = [f"{status}: {', '.join(nums)}" for status, nums in sorted(by_status.items())]
    skipped = ", ".join(f"claim {n} ({text}) needs {'k / tau' if n == 4 else 'other'} experiments and is not judged"
                        for n, (text, _) in NOT_JUDGED.items() if n not in {c.number for c in claims})
    return f"Claims of the paper (method.md §6), by the same rule: {'; '.join(parts)}." + (
        f" {skipped.capitalize()}." if skipped else "")

"""The report's opening summary, written from the numbers: what learned, by how much, and
which claims hold. Differences use the claims' rule (report.claims.compare: more than two
standard errors of the difference of seed means), so the summary and the table agree."""
from __future__ import annotations

from margrpo.report.claims import FAILS, HOLDS, NOT_JUDGED, Claim, compare, one_sample
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


def held_out(evals: dict[str, dict[str, list[float]]], methods: list[str], base: str = "base") -> str:
    key, label = HEADLINE
    if base not in evals or key not in evals[base]:
        return "No held-out scores of the base model: the comparison needs evaluate@base."
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
                        for n, (text, _) in NOT_JUDGED.items())
    return f"Claims of the paper (method.md §6), by the same rule: {'; '.join(parts)}. {skipped.capitalize()}."

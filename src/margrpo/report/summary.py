"""The report's opening lines, written from the numbers: one line per method (its test
score, its gain over the base with the 95% t-interval over seeds and the verdict by the
claims' rule, its training reward), and the claims' verdicts. Gains use the claims' own
functions (report.claims), so the summary and the claims table agree."""
from __future__ import annotations

from margrpo.report.claims import DELTA, FAILS, HOLDS, NO_DIFF, NOT_JUDGED, Claim, compare, interval_part
from margrpo.report.intervals import score_interval
from margrpo.stats import mean_std

HEADLINE = ("eval/geneval/overall", "GenEval overall")
SECONDARY = ("eval/t2i/mean", "T2I mean")
WORD = {HOLDS: "better", FAILS: f"worse by more than {DELTA}", NO_DIFF: f"within ±{DELTA}"}


def _gain(metric: str, method: str, per_prompt: dict, evals: dict, base: str) -> str:
    """'+0.046 [-0.055, +0.147] inconclusive' for method − base: the paired t-interval from
    the per-prompt scores, else from the per-seed values."""
    pp, base_pp = per_prompt.get(method), per_prompt.get(base)
    part = interval_part("", pp, base_pp, metric) if pp and base_pp else None
    if part is None:
        part = compare("", evals.get(method, {}).get(metric), evals.get(base, {}).get(metric), DELTA)
    if part.d is None:
        return "not measured"
    return part.render().removeprefix(": d ").replace(f"({part.status})", WORD.get(part.status, part.status))


def method_lines(per_prompt: dict[str, dict], evals: dict[str, dict[str, list[float]]], stats: dict[str, dict],
                 methods: list[str], base: str = "base") -> list[str]:
    """The base's test score, then one line per method: test score, gains over the base
    (GenEval overall and T2I mean), and the training reward's final window (change from the
    early window)."""
    key, label = HEADLINE

    def score(target):
        iv = score_interval(per_prompt[target], key) if per_prompt.get(target) else None
        vals = evals.get(target, {}).get(key)
        return iv.cell() if iv else f"{mean_std(vals)[0]:.3f}" if vals else "not evaluated"

    lines = [f"{base}: test {label} {score(base)} (mean [95% t-interval over seeds], final checkpoints)."]
    for m in methods:
        reward = ""
        st = stats.get(m, {})
        if (fin := st.get("final", {}).get("reward/mean")) and (grow := st.get("growth", {}).get("reward/mean")):
            reward = f"; training reward {mean_std(fin)[0]:.3f} ({mean_std(grow)[0]:+.3f} from the early window)"
        lines.append(f"{m}: test {label} {score(m)}; gain over {base} {_gain(key, m, per_prompt, evals, base)}; "
                     f"{SECONDARY[1]} gain {_gain(SECONDARY[0], m, per_prompt, evals, base)}{reward}.")
    return lines


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


def claims_line(claims: list[Claim]) -> str:
    by_status: dict[str, list[str]] = {}
    for c in claims:
        by_status.setdefault(c.status, []).append(str(c.number))
    parts = [f"{status}: {', '.join(nums)}" for status, nums in sorted(by_status.items())]
    skipped = ", ".join(f"claim {n} ({text}) needs {'k / tau' if n == 4 else 'other'} experiments and is not judged"
                        for n, (text, _) in NOT_JUDGED.items() if n not in {c.number for c in claims})
    return f"Claims of the paper (method.md §6): {'; '.join(parts)}." + (
        f" {skipped.capitalize()}." if skipped else "")

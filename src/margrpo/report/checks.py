"""Report sections that check what training optimised: the training reward against the
evaluation judge (reward hacking), and the consistency filter of the speculative tokens.
Both read keys only newer training records have; without them the section is left out."""
from __future__ import annotations

import math
import re
from pathlib import Path

from margrpo.report.figures import JUDGE_KEYS, judge_figure
from margrpo.report.learning import HACKING_RULE, proxy_judge_changes
from margrpo.report.render import Figure, Section, Table
from margrpo.stats import mean_std

KEPT_PREFIX, QUANTILE_PREFIX = "select/consistency_kept_tau", "select/consistency_score_q"


def _pm(mean: float, se: float) -> str:
    return f"{mean:+.3f}" + (f" ± {se:.3f}" if math.isfinite(se) else " (one seed)")


def judge_section(histories: dict, evals_during: dict, figures: Path) -> Section | None:
    """Reward vs judge: the curves of the training reward, the fraction of the training
    images its own detector (the proxy) judges GenEval-correct, and the fraction the
    evaluation judge does; and per method and tag the proxy's and the judge's change over
    the in-training evaluations. histories / evals_during: method -> seed -> rows."""
    fig = judge_figure(histories, figures / "reward_vs_judge.png")
    rows = []
    for m, by_seed in evals_during.items():
        for tag, c in proxy_judge_changes(by_seed).items():
            rows.append([m, tag, _pm(c["proxy"], c["proxy_se"]), _pm(c["judge"], c["judge_se"]),
                         _pm(c["gap"], c["gap_se"]), str(c["seeds"]), "reward hacking" if c["hacking"] else "–"])
    if fig is None and not rows:
        return None
    text = ("The training reward is a proxy: the world reward's own detector. The evaluation judge is a separate "
            "detector that applies GenEval's rules. A policy that games the proxy makes the two part: the proxy "
            "improves while the judge does not.")
    section = Section("Reward vs judge", [text])
    if fig is not None:
        section.figures.append(Figure(fig, f"Per method, over training steps: {', '.join(JUDGE_KEYS)} on the "
                                           "training batch (mean over seeds, band ± 1 std over seeds)"))
    if rows:
        section.paragraphs.append(
            "Held-out evaluations during training (validation split): change from the first evaluation (step 0, the "
            "base model) to the last, of the proxy's GenEval correctness and the judge's on the same images; mean "
            f"over seeds ± standard error (std over seeds / sqrt(seeds)). Rule: {HACKING_RULE}.")
        section.tables.append(Table(["method", "tag", "proxy change", "judge change", "proxy − judge", "seeds",
                                     "flag"], rows))
    return section


def _tau(key: str) -> float:
    try:
        return float(key[len(KEPT_PREFIX):])
    except ValueError:
        return math.inf


def _quantile(key: str) -> float:
    m = re.fullmatch(r"(\d+)", key[len(QUANTILE_PREFIX):])
    return float(m.group(1)) if m else math.inf


def consistency_summary(histories: dict) -> dict[str, tuple[float, float, int]]:
    """key -> (mean over seeds of the seed's mean over steps, std over seeds, seeds) of the
    consistency filter's keys (kept fraction per tau, score quantiles). histories: seed ->
    history rows."""
    per_seed: dict[str, list[float]] = {}
    for rows in histories.values():
        keys = {k for r in rows for k in r if k.startswith((KEPT_PREFIX, QUANTILE_PREFIX))}
        for k in keys:
            vals = [float(r[k]) for r in rows if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])]
            if vals:
                per_seed.setdefault(k, []).append(sum(vals) / len(vals))
    return {k: mean_std(v) for k, v in per_seed.items()}


def consistency_section(histories: dict) -> Section | None:
    """Table: per method that logs them, the fraction of speculative tokens the consistency
    filter keeps at each tau and the quantiles of its similarity score."""
    summaries = {m: s for m, h in histories.items() if (s := consistency_summary(h))}
    if not summaries:
        return None
    keys = {k for s in summaries.values() for k in s}
    kept = sorted((k for k in keys if k.startswith(KEPT_PREFIX)), key=_tau)
    quantiles = sorted((k for k in keys if k.startswith(QUANTILE_PREFIX)), key=_quantile)
    header = ["method", *[f"kept, tau {k[len(KEPT_PREFIX):]}" for k in kept],
              *[f"score q{k[len(QUANTILE_PREFIX):]}" for k in quantiles]]
    rows = [[m, *[f"{s[k][0]:.3f} ± {s[k][1]:.3f}" if k in s else "–" for k in kept + quantiles]]
            for m, s in summaries.items()]
    return Section("Consistency filter of the speculative tokens",
                   ["Per step the trainer logs the fraction of speculative tokens the consistency filter would keep at "
                    "each threshold tau, and quantiles of the similarity score it thresholds; mean over steps, then "
                    "mean ± std over seeds."],
                   [Table(header, rows)])

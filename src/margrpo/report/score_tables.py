"""The report's test-score tables: scores per target, final and best checkpoints, the
compositional-generalisation ("novel") prompts, and the summary.json headline numbers.

Where the evaluate stage wrote per-prompt scores (per_prompt.json), a GenEval or T2I cell is
"mean [low, high]": the headline statistic with its 95% t-interval over seeds (report/
intervals.py t_interval), and gains are paired with the base by seed and prompt.
Records without per-prompt scores keep "mean ± std over replicates".
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from margrpo.report.intervals import (HEADLINE_SUBSETS, LEVEL, NOVEL_SUBSETS, has_subset, metric_spec,
                                      prompt_counts, score_interval)
from margrpo.report.render import Section, Table
from margrpo.stats import mean_std

OVERALL, T2I_MEAN = "eval/geneval/overall", "eval/t2i/mean"
# reports/summary.json: headline name -> held-out metric.
HEADLINE_KEYS = {"overall": OVERALL, "t2i": T2I_MEAN, "partial": "eval/partial"}
INTERVAL_TEXT = (f"mean [{LEVEL:.0%} interval]: the point is the headline statistic (mean over tags or categories of "
                 "the mean over their prompts, averaged over seeds); the interval is a t-interval over seeds (the "
                 "test prompts are fixed, so it is about this prompt set; each seed's score averages its own "
                 "evaluation, so the evaluation noise is part of the spread between seeds); a gain is the paired "
                 "difference method − base on the same seeds (image seeds) and prompts")


def fmt(mean: float | None, std: float | None = None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"


def _metric_order(k: str):
    return not k.startswith("eval/geneval"), k.endswith(("overall", "mean")), k


def _interval(pp: dict | None, metric: str, which: str = "final", subsets=HEADLINE_SUBSETS):
    """A target's interval; None without per-prompt scores for the metric."""
    if not pp or metric_spec(metric) is None:
        return None
    return score_interval(pp, metric, which, subsets=subsets)


def _gain(pp: dict | None, base_pp: dict | None, metric: str, which: str = "final", subsets=HEADLINE_SUBSETS):
    """The paired interval of target − base (base's final checkpoints); None unless both
    have per-prompt scores."""
    if not pp or not base_pp or metric_spec(metric) is None:
        return None
    return score_interval(pp, metric, which, minus=base_pp, subsets=subsets)


def scores_table(evals: dict, per_prompt: dict, targets: list[str], base: str = "base") -> Table:
    """Rows: every metric of the targets' metrics.json, then the gains over the base of the
    two headline metrics where per-prompt scores exist; columns: targets."""
    metrics = sorted({k for t in targets for k in evals[t]["mean"]}, key=_metric_order)
    rows = []
    for k in metrics:
        row = [k]
        for t in targets:
            iv = _interval(per_prompt.get(t), k)
            row.append(iv.cell() if iv else fmt(evals[t]["mean"].get(k), evals[t]["std"].get(k)))
        rows.append(row)
    for k in (OVERALL, T2I_MEAN):
        gains = {t: _gain(per_prompt.get(t), per_prompt.get(base), k) for t in targets if t != base}
        if any(gains.values()):
            rows.append([f"gain vs {base}: {k}", *[gains[t].cell(signed=True) if gains.get(t) else "–"
                                                    for t in targets]])
    return Table(["metric", *targets], rows)


def best_section(reports: Path, per_seed: dict, per_prompt: dict, methods: list[str], base: str = "base") -> Section:
    """Test scores of the final and the best-by-held-out checkpoints, paired with the base
    per replicate (the same image seeds). per_seed: target -> the final models' per_seed.json."""
    key = OVERALL
    base_seeds = per_seed.get(base, {})
    rows, with_iv = [], False
    for m in methods:
        row = [m]
        best_path = reports / "eval" / m / "per_seed_best.json"
        best = json.loads(best_path.read_text()) if best_path.exists() else {}
        for which, by_seed in (("final", per_seed.get(m, {})), ("best", best)):
            score = _interval(per_prompt.get(m), key, which)
            gain = _gain(per_prompt.get(m), per_prompt.get(base), key, which)
            if score is not None:
                with_iv = True
                row += [score.cell(), gain.cell(signed=True) if gain else "–"]
                continue
            scores = {s: r[key] for s, r in by_seed.items() if key in r}
            gains = [v - base_seeds[s][key] for s, v in scores.items() if s in base_seeds and key in base_seeds[s]]
            row += [fmt(*mean_std(list(scores.values()))[:2]) if scores else "–",
                    fmt(*mean_std(gains)[:2]) if gains else "–"]
        rows.append(row)
    spread = (f"cells with per-prompt scores (test and unseen-tag prompts): {INTERVAL_TEXT}; others: mean ± std over "
              "seeds of the per-replicate values and gains." if with_iv else "mean ± std over seeds.")
    return Section("Final and best checkpoints (test split)",
                   ["GenEval-style overall on the test prompts. best: the checkpoint with the highest held-out "
                    "(validation split) overall during training, chosen without the test prompts. gain: method − base "
                    f"on the same image seeds, per replicate; {spread}"],
                   [Table(["method", "final", "final gain", "best", "best gain"], rows)])


def novel_section(per_prompt: dict, methods: list[str], base: str = "base") -> Section | None:
    """Compositional generalisation: the prompts with an attribute-object binding that no
    training prompt has, base against each method; None when no target has such prompts."""
    if not any(pp and has_subset(pp, NOVEL_SUBSETS) for pp in per_prompt.values()):
        return None
    rows = []
    for t in [base, *methods]:
        pp = per_prompt.get(t)
        cells = []
        for k in (OVERALL, T2I_MEAN):
            iv = _interval(pp, k, subsets=NOVEL_SUBSETS)
            gain = None if t == base else _gain(pp, per_prompt.get(base), k, subsets=NOVEL_SUBSETS)
            cells += [iv.cell() if iv else "–", gain.cell(signed=True) if gain else "–"]
        rows.append([t, *cells])
    return Section("Compositional generalisation (novel bindings, test split)",
                   ["Prompts that bind an attribute to an object in a way no training prompt does; not part of the "
                    f"headline scores. Final checkpoints; {INTERVAL_TEXT}."],
                   [Table(["target", "GenEval overall", "gain vs base", "T2I mean", "gain vs base"], rows)])


def prompt_counts_line(per_prompt: dict) -> str | None:
    """How many distinct prompts each subset and tag / category has (the prompts are the
    same for every target: read from the first per_prompt.json)."""
    pp = next((p for p in per_prompt.values() if p), None)
    if pp is None:
        return None
    parts = []
    order = [*HEADLINE_SUBSETS, *NOVEL_SUBSETS]
    for subset, counts in sorted(prompt_counts(pp).items(), key=lambda kv: (kv[0] not in order, order.index(kv[0])
                                                                            if kv[0] in order else 0, kv[0])):
        groups = ", ".join(f"{g} {n}" for g, n in sorted(counts.items()) if g != "all")
        parts.append(f"{subset}: {counts.get('all', 0)} ({groups})")
    images = pp.get("images") or []
    held_out = sorted({r["tag"] for r in pp.get("prompts", []) if r.get("subset") == "unseen_tag" and r.get("tag")})
    per = f"{pp.get('images_per_prompt', '?')} images per prompt and seed"
    if images and max(images) > min(images):
        per += f" ({min(images)}-{max(images)}: more for the GenEval tags with few prompts)"
    return (f"Distinct prompts per subset (per GenEval tag and T2I category; {per}): " + "; ".join(parts)
            + ". The headline scores use test (combinations no model trained on) and unseen_tag"
            + (f" (tags held out from training, validation and pretraining: {', '.join(held_out)})" if held_out else "")
            + "; novel is reported apart.")


def headline(evals: dict, per_prompt: dict, targets: list[str], base: str = "base") -> dict:
    """summary.json's score keys. overall / t2i / partial: the headline statistic (from the
    per-prompt scores where they exist, else metrics.json's mean over replicates); gain:
    overall − base's; overall_ci / gain_ci: target -> [low, high] of the t-interval
    (paired for the gain); novel: target -> GenEval overall on the novel prompts."""
    out: dict[str, dict] = {}
    for name, key in HEADLINE_KEYS.items():
        out[name] = {}
        for t in targets:
            iv = _interval(per_prompt.get(t), key)
            if iv is not None:
                out[name][t] = iv.point
            elif key in evals[t]["mean"]:
                out[name][t] = evals[t]["mean"][key]
    ref = out["overall"].get(base)
    out["gain"] = {m: v - ref for m, v in out["overall"].items() if m != base and ref is not None}
    out["overall_ci"], out["gain_ci"], out["novel"] = {}, {}, {}
    for t in targets:
        if iv := _interval(per_prompt.get(t), OVERALL):
            out["overall_ci"][t] = [iv.low, iv.high]
        if t != base and (gain := _gain(per_prompt.get(t), per_prompt.get(base), OVERALL)):
            out["gain_ci"][t] = [gain.low, gain.high]
            out["gain"][t] = gain.point  # the paired difference on the common seeds
        if iv := _interval(per_prompt.get(t), OVERALL, subsets=NOVEL_SUBSETS):
            out["novel"][t] = iv.point
    return out

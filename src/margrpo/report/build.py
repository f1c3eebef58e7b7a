"""Gather the study's outputs into report sections and a summary (pure reads + figures)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from margrpo.report import ablation
from margrpo.report import summary as summary_text
from margrpo.report.checks import consistency_section, judge_section
from margrpo.report.claims import DELTA, ERROR_RATE, NOT_JUDGED, RULE, STATUS_CODE, Claim, apply_design, build_claims
from margrpo.report.curves import read_history, train_stats
from margrpo.report.figures import forest_figure, plot_curves, scores_figure, selection_figure
from margrpo.report.intervals import read_per_prompt, score_interval
from margrpo.report.learning import PAIRED_KEY, reward_hacking, reward_rise, rise_key, steps_to_detect
from margrpo.report.render import Figure, Section, Table
from margrpo.report.score_tables import (INTERVAL_TEXT, best_section, fmt, headline, novel_section,
                                         prompt_counts_line, scores_table)
from margrpo.stats import mean_std

CURVE_KEYS = ["reward/mean", "loss/kl", "diag/grad_norm_ar", "diag/grad_norm_head"]
# Held-out scores plotted over training, when the trainer evaluates during training.
HELDOUT_CURVE_KEYS = ["eval/geneval/overall", "eval/t2i/mean", "eval/partial"]
SELECT_KEYS = ["select/topk_frac", "select/consistency_frac", "select/ess", "diag/uncertainty_mean"]


def noise_line(evals: dict, methods: list[str], key: str = "eval/geneval/overall") -> str | None:
    """Evaluation noise beside the seed spread: sigma_E is the sd of the one base model's
    overall over the replicates' image seeds; the seed spread is each method's sd over its
    trained seeds (which holds sigma_E too)."""
    base = evals.get("base") or {}
    if key not in base.get("std", {}) or base.get("replicates", 0) < 2:
        return None
    spreads = [f"{m} {evals[m]['std'][key]:.3f}" for m in methods if key in (evals.get(m) or {}).get("std", {})]
    return (f"Evaluation noise of the GenEval overall: sigma_E = {base['std'][key]:.3f} (the base model over "
            f"{base['replicates']} evaluation seeds); spread over trained seeds: " + (", ".join(spreads) or "–") + ".")

def train_record_dir(reports: Path, method: str, seed) -> Path:
    """Per-seed training record (history.jsonl, selection_examples.pt) that the train stage
    writes under `reports`: small and in git, so the report needs no trained weights."""
    return reports / "train" / method / "seeds" / f"seed{seed}"


def eval_stage(target: str) -> str:
    """The dvc.yaml stage that writes reports/eval/<target>/."""
    return "evaluate_base" if target == "base" else f"evaluate@{target}"


def _read_json(path: Path, stage: str) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the report needs stage {stage} (dvc repro {stage})")
    return json.loads(path.read_text())


def build(params, targets: list[str], methods: list[str], reports: Path,
          figures: Path | None = None, design=None) -> tuple[list[Section], dict]:
    """Report sections and summary from what the stages wrote under `reports` (eval/<target>/,
    train/<method>/seeds/seed<s>/, baseline/): the trained weights are not needed. Figures
    are written to `figures` (default reports/figures). design: the study design (report/
    design.py) that gives each claim part its margin, effect and power; None: score parts
    use claims.DELTA, other parts a margin of 0, and no power is stated."""
    import yaml

    figures = Path(figures or reports / "figures")
    figures.mkdir(parents=True, exist_ok=True)
    seeds = list(params.train.seeds)
    histories = {m: {s: read_history(p) for s in seeds if (p := train_record_dir(reports, m, s) / "history.jsonl").exists()}
                 for m in methods}
    evals = {t: _read_json(reports / "eval" / t / "metrics.json", eval_stage(t)) for t in targets}
    per_seed = {t: _read_json(reports / "eval" / t / "per_seed.json", eval_stage(t)) for t in targets}
    eval_values = {t: {k: [r[k] for r in per_seed[t].values() if k in r] for k in evals[t]["mean"]} for t in targets}
    # Per-seed, per-prompt scores (absent in records older than the evaluate stage that writes them).
    per_prompt = {t: pp for t in targets if (pp := read_per_prompt(reports, t, seeds)) is not None}
    baseline = reports / "baseline" / "metrics.json"
    base_reward = json.loads(baseline.read_text()).get("baseline/reward_mean") if baseline.exists() else None
    stats = {m: train_stats(h) for m, h in histories.items()}
    timing = {m: stats[m]["final"].get("time/step", []) for m in methods}
    claims = build_claims(stats, eval_values, {m: params.methods[m].model_dump() for m in methods},
                          params.claims.roles(), timing, per_prompt)
    # The ablation experiments' committed records (reports/ablation/): their section and claim 4.
    records = ablation.read_records(reports / "ablation")
    ablation_sections, knob_claim, ablation_summary = ablation.section(records, figures)
    if knob_claim is not None:
        claims = sorted([*claims, knob_claim], key=lambda c: c.number)
    ablation.note_long_verdicts(claims, records)
    apply_design(claims, design, len(seeds))

    sections = _opening(claims, per_prompt, eval_values, stats, methods, figures, len(seeds))

    spread = f"mean ± std over {len(seeds)} replicate(s)"
    if per_prompt:
        spread = (f"GenEval and T2I cells of targets with per-prompt scores (test and unseen-tag prompts): "
                  f"{INTERVAL_TEXT}; other cells: {spread}")
    scores = Section(
        "Test scores: base vs trained methods",
        [f"World test prompts (a split used by no training decision), {params.evaluate.images_per_prompt} images per "
         f"prompt (at least {params.evaluate.images_per_tag} per GenEval tag), final checkpoints; {spread} (train "
         f"seeds {seeds}; for base, the same model with each replicate's image seeds). eval/geneval/* are GenEval-rule "
         "per-tag accuracies, eval/t2i/* T2I-CompBench-style per-category scores, eval/partial the dense requirement "
         "score."]
        + ([line] if (line := prompt_counts_line(per_prompt)) else [])
        + ([line] if (line := noise_line(evals, methods)) else []),
        [scores_table(evals, per_prompt, targets)])
    if path := scores_figure(evals, figures / "heldout_scores.png"):
        scores.figures.append(Figure(path, "Held-out score per tag and category: trained methods (bars, ± std over "
                                           "replicates) against the base model (dashed line)"))
    sections.append(scores)
    sections.append(best_section(reports, per_seed, per_prompt, methods))
    if novel := novel_section(per_prompt, methods):
        sections.append(novel)

    train_rows = []
    for m in methods:
        fin = stats[m]["final"]
        for k in CURVE_KEYS + SELECT_KEYS + ["reward/peak_drop", "time/step", "time/rollout"]:
            if k in fin:
                mean, sd, _ = mean_std(fin[k])
                train_rows.append([m, k, fmt(mean, sd)])
    curves = Section("Training curves", ["Mean over seeds, band ± 1 std; final window = last 25% of steps. Dashed: "
                                         "the base model (training reward of its own samples, from sample_baseline; "
                                         "held-out scores from evaluate_base)."],
                     [Table(["method", "metric (final window)", "mean ± std over seeds"], train_rows)])
    # Held-out scores during training (the trainer's evals.jsonl, when train.eval_every > 0):
    # step 0 is the base model on the same prompts, the reference line.
    evals_during = {m: {s: read_history(p) for s in seeds
                        if (p := train_record_dir(reports, m, s) / "evals.jsonl").exists()} for m in methods}
    eval_keys = sorted({k for h in evals_during.values() for rows_ in h.values() for r in rows_ for k in r
                        if k in HELDOUT_CURVE_KEYS})
    reference = {k: ref for k in eval_keys if (ref := _step0_reference(evals_during, k))}
    if base_reward is not None:
        reference["reward/mean"] = (base_reward, "base (sample_baseline)")
    for name, keys, source in (("curves", CURVE_KEYS, histories), ("heldout", eval_keys, evals_during),
                               ("selection", SELECT_KEYS, histories)):
        if keys and (path := plot_curves(source, keys, figures / f"train_{name}.png", reference)):
            curves.figures.append(Figure(path, f"Training {name}: " + ", ".join(keys)))
    sections.append(curves)
    sections.append(_learning_section(params, histories, evals_during))
    sections += [s for s in (judge_section(histories, evals_during, figures), consistency_section(histories)) if s]

    grids = Section("Samples: same prompts and seeds across methods",
                    ["Replicate 0, held-out prompts across tags (evaluate.grid_prompts); each column is one image seed, "
                     "identical across methods."])
    grids.figures = [Figure(reports / "eval" / t / "grid.png", t, pixelated=True) for t in targets
                     if (reports / "eval" / t / "grid.png").exists()]
    sections.append(grids)

    maps = Section("Uncertainty and token-selection maps", [])
    for m in methods:
        ex = train_record_dir(reports, m, seeds[0]) / "selection_examples.pt"
        if ex.exists() and (fig := selection_figure(_load_examples(ex), figures / f"selection_{m}.png")):
            maps.figures.append(Figure(fig, f"{m}, seed {seeds[0]}: the last rollout's per-token maps"))
    if not maps.figures:
        maps.paragraphs.append("The trainer wrote no selection examples with information for these methods.")
    sections.append(maps)

    probe_rows = [[m, k, fmt(mean_std(v)[0]), str(len(v))] for m in methods
                  for k, v in sorted(stats[m]["final"].items()) if k.startswith("probe/")]
    sections.append(Section(
        "Gradient-variance measurements",
        ["From the trainer's gradient probe (train.grad_probe_every): two independent gradient estimates on a "
         "fixed rollout; noise_var estimates trace Cov(g); var_ratio_vs_single is the method's noise variance "
         "over the single-chain estimator's. Averaged over probe steps, then over seeds."
         if probe_rows else "No probe metrics were logged (train.grad_probe_every = 0)."],
        [Table(["method", "metric", "mean over seeds", "seeds"], probe_rows)] if probe_rows else []))
    sections += ablation_sections

    sections.append(Section(
        "Claims of the paper (method.md §6) against this run",
        [f"Rule: {RULE}. Evidence: one line per comparison, d = the difference (with its interval for score parts "
         "with per-prompt scores, else 2 se of the difference of seed means). reports/summary.json codes each claim "
         "as " + ", ".join(f"{code} {status}" for status, code in STATUS_CODE.items()) + "."]
        + [f"Claim {n} ({text}) is not in the table: it {why}." for n, (text, why) in NOT_JUDGED.items()
           if n not in {c.number for c in claims}],
        [Table(["#", "claim", "verdict", "evidence (each part's verdict within the claim)", "note"],
               [[str(c.number), c.claim, c.status,
                 [f"{p.render()}" + ("" if s == p.status else f" → {s} within the claim")
                  for p, s in zip(c.parts, c.part_statuses())] or "–", c.note or "–"]
                for c in claims])], anchor="claims"))
    sections.append(Section("Params used", [], [], [], yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)))

    # Short, flat keys: `dvc exp show` names columns by them (overall.mar_grpo, gain.grpo).
    summary = headline(evals, per_prompt, targets)
    # Numeric so that `dvc metrics diff` can compare studies: 1 holds, 0 inconclusive, -1 does
    # not hold, 2 no difference larger than δ (claims.STATUS_CODE).
    summary["claims"] = {f"claim{c.number}": STATUS_CODE[c.status] for c in claims}
    summary["seeds"] = len(seeds)
    if ablation_summary:
        summary["ablation"] = ablation_summary
    return sections, summary


def _opening(claims: list[Claim], per_prompt: dict, evals: dict, stats: dict, methods: list[str],
             figures: Path, seeds: int, base: str = "base") -> list[Section]:
    """The first screen: the forest plot of every gain over the base and every claim part,
    the claims with verdict, error rate and power, then one line per method."""
    gains = []
    for m in methods:
        if per_prompt.get(m) and per_prompt.get(base):
            iv = score_interval(per_prompt[m], summary_text.HEADLINE[0], minus=per_prompt[base])
            if iv is not None:
                gains.append((m, iv.point, iv.low, iv.high, DELTA))
    # Claim parts in units of their own margin (d / delta), so every part shares the ±1 band.
    parts = [(f"claim {c.number}: {p.text}", p.d / p.delta, low / p.delta, high / p.delta, 1.0)
             for c in claims for p in c.parts if p.d is not None and p.delta > 0 for low, high in [p.bounds()]]
    forest = Section("At a glance", anchor="glance")
    if path := forest_figure([(f"Gain over the {base}: test {summary_text.HEADLINE[1]}", gains),
                              ("Claim parts: d / δ", parts)], figures / "forest.png"):
        forest.figures.append(Figure(path, f"Top: every method's gain over the {base} (test "
                                           f"{summary_text.HEADLINE[1]}, paired by seed), grey ±{DELTA}. Bottom: every "
                                           "claim part's difference in units of its own margin δ (study_design.yaml), "
                                           "grey ±δ. Lines: 95% t-intervals over seeds; blue point: holds (interval "
                                           "above 0), red: does not hold (below −δ), grey: neither, at the part's own "
                                           "level (the claims table applies Holm within each claim)"))
    table = Table(["#", "claim", "verdict", "error rate", f"power at {seeds} seeds", "seeds for 80%"],
                  [[str(c.number), c.claim, c.status, f"{ERROR_RATE}, {len(c.parts)} parts" if c.parts else "–",
                    "–" if c.power is None else f"{c.power:.0%}",
                    "–" if c.power is None else str(c.seeds_needed or "> 10000")] for c in claims])
    glance = Section("Claims", ["Verdicts by the rule of the claims section below; power: the chance that every "
                                "part holds if each difference is its smallest effect of interest "
                                "(study_design.yaml), at the pilot's variances."], [table])
    lines = summary_text.method_lines(per_prompt, evals, stats, methods, base)
    lines += [line for line in (summary_text.reward_vs_judge(per_prompt, methods), summary_text.claims_line(claims))
              if line]
    return [forest, glance, Section("Summary", lines, anchor="summary")]


def _rise_cell(history: list[dict], window: int, key: str) -> str:
    try:
        r = reward_rise(history, window, key)
    except ValueError:
        return "–"
    z = f"z {r['z']:.1f}" if math.isfinite(r["z"]) else "one value per window"
    return f"{r['rise']:+.3f} ± {r['se']:.3f} ({z})"


def _learning_section(params, histories: dict, evals_during: dict) -> Section:
    """Per run: did the training reward rise (raw, and paired with the base on the same
    batches where the method logs it), and did held-out tags fall while it rose (reward
    hacking: report/learning.py)."""
    images_per_tag = params.world.heldout_prompts_per_tag * params.train.eval_images_per_prompt
    rows, paired_any = [], False
    for m, seeds in histories.items():
        # 10-step windows; half the run when a method trains for fewer than 20 steps
        window = max(1, min(10, (params.train_for(m).steps if m in params.methods else params.train.steps) // 2))
        for s, h in seeds.items():
            ev = evals_during.get(m, {}).get(s, [])
            key = rise_key(h)
            paired_any |= key == PAIRED_KEY
            try:
                needed = str(steps_to_detect(h, 3.0, window, key)["steps"])
            except ValueError:
                needed = "–"
            overall = [e["eval/geneval/overall"] for e in ev if "eval/geneval/overall" in e]
            path = " → ".join(f"{v:.3f}" for v in overall) or "–"
            hacked = reward_hacking(h, ev, images_per_tag, window=window) if len(h) >= 2 * window else []
            rows.append([m, str(s), _rise_cell(h, window, "reward/mean"),
                         _rise_cell(h, window, PAIRED_KEY) if key == PAIRED_KEY else "–",
                         needed, path, ", ".join(hacked) or "none"])
    paired_note = (" paired with the base: the same rise of the training reward minus the base model's reward on "
                   "the same prompts and image seeds, logged every step by the methods with paired_base (most of a "
                   "step's noise is which prompts it drew, and the base sees the same draw); where it exists the "
                   "rise test and the steps for 3 se read it." if paired_any else "")
    return Section("Learning checks",
                   ["Training reward: mean of the last 10 steps minus the first 10 (half the run in runs shorter "
                    "than 20 steps), ± standard error (steps as independent draws);" + paired_note + " Steps for 3 se: "
                    "how many steps that difference would need to reach 3 standard errors if the reward kept its "
                    "fitted linear trend and noise (inf: no upward trend). "
                    "Held-out overall at each in-training evaluation (validation split, "
                    f"{params.train.eval_images_per_prompt} images per prompt; the first is the base model). Tags that "
                    "fell by more than 2 standard errors while the reward rose by more than 2 are flagged as reward "
                    "hacking."],
                   [Table(["method", "seed", "reward rise", "paired rise (vs base)", "steps for 3 se",
                           "held-out overall during training", "tags fallen (hacking)"],
                          rows)])


def _step0_reference(evals_during: dict, key: str) -> tuple[float, str] | None:
    """The base model's value of an in-training held-out score: its step-0 evaluation."""
    at_zero = [r[key] for h in evals_during.values() for rows in h.values() for r in rows if r["step"] == 0 and key in r]
    return (mean_std(at_zero)[0], "base (step 0)") if at_zero else None


def _load_examples(path: Path) -> dict:
    import torch

    return torch.load(path, weights_only=False)

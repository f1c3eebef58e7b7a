"""Gather the study's outputs into report sections and a summary (pure reads + figures)."""
from __future__ import annotations

import json
import math
from pathlib import Path

from margrpo.report.claims import RULE, build_claims
from margrpo.report.curves import plot_curves, read_history, window_mean
from margrpo.report.render import Figure, Section, Table

CURVE_KEYS = ["reward/mean", "loss/kl", "diag/grad_norm_ar", "diag/grad_norm_head"]
SELECT_KEYS = ["select/topk_frac", "select/consistency_frac", "select/ess", "diag/uncertainty_mean"]


def fmt(mean: float | None, std: float | None = None) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    return f"{mean:.3f}" if std is None else f"{mean:.3f} ± {std:.3f}"


def train_stats(histories: dict[int, list[dict]]) -> dict[str, dict[str, list[float]]]:
    """Per-seed 'final' window means, 'growth' (final − early window) and reward/peak_drop."""
    keys = sorted({k for h in histories.values() for r in h for k in r if k != "step"})
    final: dict[str, list[float]] = {}
    growth: dict[str, list[float]] = {}
    for h in histories.values():
        for k in keys:
            f, e = window_mean(h, k, "final"), window_mean(h, k, "early")
            if f is not None:
                final.setdefault(k, []).append(f)
            if f is not None and e is not None and not k.startswith("probe/"):
                growth.setdefault(k, []).append(f - e)
        rewards = [r["reward/mean"] for r in h if "reward/mean" in r]
        if rewards:
            final.setdefault("reward/peak_drop", []).append(max(rewards) - window_mean(h, "reward/mean", "final"))
    return {"final": final, "growth": growth}


def selection_figure(examples_path: Path, out: Path, max_steps: int = 4) -> Path | None:
    """Images of the last rollout beside their per-token maps at a few AR steps (every
    [n, N] tensor of a step record, N = g*g tokens, drawn as a g x g heat map)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    ex = torch.load(examples_path, weights_only=False)
    images, steps = ex.get("images"), ex.get("steps") or []
    if images is None or not steps:
        return None
    picked = steps[:: max(1, math.ceil(len(steps) / max_steps))][:max_steps]
    maps = [(s.get("ar_step", i), k, v) for i, s in enumerate(picked)
            for k, v in s.items() if torch.is_tensor(v) and v.ndim == 2]
    n = images.shape[0]
    fig, axes = plt.subplots(n, 1 + len(maps), figsize=(1.6 * (1 + len(maps)), 1.7 * n), squeeze=False)
    for i in range(n):
        axes[i][0].imshow(images[i].permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")
        axes[i][0].set_title((ex.get("prompts") or [""] * n)[i][:28], fontsize=6)
        for j, (step, key, v) in enumerate(maps, start=1):
            g = int(round(math.sqrt(v.shape[1])))
            axes[i][j].imshow(v[i].float().reshape(g, g).numpy(), cmap="viridis", interpolation="nearest")
            if i == 0:
                axes[i][j].set_title(f"step {step}\n{key}", fontsize=6)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def train_record_dir(reports: Path, method: str, seed) -> Path:
    """Per-seed training record (history.jsonl, selection_examples.pt) that the train stage
    writes under `reports`: small and in git, so the report needs no trained weights."""
    return reports / "train" / method / "seeds" / f"seed{seed}"


def build(params, targets: list[str], methods: list[str], reports: Path) -> tuple[list[Section], dict]:
    """Report sections and summary from what the stages wrote under `reports` (eval/<target>/,
    train/<method>/seeds/seed<s>/): the trained weights are not needed."""
    import yaml

    figures = reports / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    seeds = list(params.train.seeds)
    histories = {m: {s: read_history(p) for s in seeds if (p := train_record_dir(reports, m, s) / "history.jsonl").exists()}
                 for m in methods}
    evals = {t: json.loads((reports / "eval" / t / "metrics.json").read_text()) for t in targets}
    per_seed = {t: json.loads((reports / "eval" / t / "per_seed.json").read_text()) for t in targets}
    eval_values = {t: {k: [r[k] for r in per_seed[t].values() if k in r] for k in evals[t]["mean"]} for t in targets}
    stats = {m: train_stats(h) for m, h in histories.items()}
    sections = []

    metrics = sorted({k for t in targets for k in evals[t]["mean"]},
                     key=lambda k: (not k.startswith("eval/geneval"), k.endswith(("overall", "mean")), k))
    rows = [[k] + [fmt(evals[t]["mean"].get(k), evals[t]["std"].get(k)) for t in targets] for k in metrics]
    sections.append(Section(
        "Held-out scores: base vs trained methods",
        [f"World held-out prompts, {params.evaluate.images_per_prompt} images per prompt; mean ± std over "
         f"{len(seeds)} replicate(s) (train seeds {seeds}; for base, the same model with each replicate's image "
         "seeds). eval/geneval/* are GenEval-rule per-tag accuracies, eval/t2i/* T2I-CompBench-style per-category "
         "scores, eval/partial the dense requirement score; all from the embedded world evaluator."],
        [Table(["metric", *targets], rows)]))

    train_rows = []
    for m in methods:
        fin = stats[m]["final"]
        for k in CURVE_KEYS + SELECT_KEYS + ["reward/peak_drop", "time/step", "time/rollout"]:
            if k in fin:
                mean = sum(fin[k]) / len(fin[k])
                sd = math.sqrt(sum((v - mean) ** 2 for v in fin[k]) / (len(fin[k]) - 1)) if len(fin[k]) > 1 else 0.0
                train_rows.append([m, k, fmt(mean, sd)])
    curves = Section("Training curves", [f"Mean over seeds, band ± 1 std; final window = last 25% of steps."],
                     [Table(["method", "metric (final window)", "mean ± std over seeds"], train_rows)])
    for name, keys in (("curves", CURVE_KEYS), ("selection", SELECT_KEYS)):
        path = plot_curves(histories, keys, figures / f"train_{name}.png")
        if path:
            curves.figures.append(Figure(path, f"training {name}: " + ", ".join(keys)))
    sections.append(curves)

    grids = Section("Samples: same prompts and seeds across methods",
                    ["Replicate 0, held-out prompts across tags (evaluate.grid_prompts); each column is one image seed, identical across methods."])
    grids.figures = [Figure(reports / "eval" / t / "grid.png", f"{t}") for t in targets
                     if (reports / "eval" / t / "grid.png").exists()]
    sections.append(grids)

    maps = Section("Uncertainty and token-selection maps", [])
    for m in methods:
        ex = train_record_dir(reports, m, seeds[0]) / "selection_examples.pt"
        if ex.exists() and (fig := selection_figure(ex, figures / f"selection_{m}.png")):
            maps.figures.append(Figure(fig, f"{m}, seed {seeds[0]}: last rollout's per-token maps"))
    if not maps.figures:
        maps.paragraphs.append("The trainer wrote no selection examples for these methods.")
    sections.append(maps)

    probe_rows = [[m, k, fmt(sum(v) / len(v)), str(len(v))] for m in methods
                  for k, v in sorted(stats[m]["final"].items()) if k.startswith("probe/")]
    sections.append(Section(
        "Gradient-variance measurements",
        ["From the trainer's gradient probe (train.grad_probe_every): two independent gradient estimates on a "
         "fixed rollout; noise_var estimates trace Cov(g); var_ratio_vs_single is the method's noise variance "
         "over the single-chain estimator's. Averaged over probe steps, then over seeds."
         if probe_rows else "No probe metrics were logged (train.grad_probe_every = 0)."],
        [Table(["method", "metric", "mean over seeds", "seeds"], probe_rows)] if probe_rows else []))

    timing = {m: stats[m]["final"].get("time/step", []) for m in methods}
    claims = build_claims(stats, eval_values, {m: params.methods[m].model_dump() for m in methods}, timing)
    sections.append(Section(
        "Claims of the paper (method.md §6) against this run",
        [f"Rule: {RULE}."],
        [Table(["#", "claim", "verdict", "evidence", "note"],
               [[str(c.number), c.claim, c.status, "; ".join(p.render() for p in c.parts) or "–", c.note or "–"]
                for c in claims])]))
    sections.append(Section("Params used", [], [], [], yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False)))

    summary = {
        # Numeric so that `dvc metrics diff` can compare studies: 1 holds, 0 inconclusive, -1 not.
        "claims": {f"claim{c.number}": {"holds": 1, "inconclusive": 0, "does not hold": -1}[c.status]
                   for c in claims},
        "scores": {t: {k: evals[t]["mean"][k] for k in ("eval/geneval/overall", "eval/t2i/mean", "eval/partial")
                       if k in evals[t]["mean"]} for t in targets},
    }
    return sections, summary

"""Does what one reward taught show in another? Each model samples the same training batches
(prompts and image seeds from the trainer's own generators at --seed, so every model draws
the same prompts with the same noise), and every image is scored by the study's world reward
(its aligned score, its GenEval-correct and partial halves) and by the dense colour share of
ladder rung a (`world_colour`). Used in docs/learning.md to ask whether rung a's colour
training moved the world reward, and rung b's world training the colour share.

    .venv/bin/python probes/reward_transfer.py --models models/base \
        outputs/ladder/a/all-step/grpo_frozen_s0/final outputs/ladder/b/all-step/grpo_frozen_s0/final \
        [--batches 2] [--seed 7]

Prints one table row per model: the means over batches x 128 images, with the standard error
of the mean over the images' prompts (the unit the batches draw); then each later model's
paired difference from the first (same prompts, same noise), with its standard error.

With --group N (train.group_size; a batch is then 16 prompts x N images) it also asks what
reweighting the model's own samples could reach: per prompt, the expected best world reward
of k of its N images and pass@k of GenEval-correct (`margrpo.probes.samples.best_of`), for
k = 1, 2, 4, ... N, per purpose (GenEval tag, else T2I category) and overall, with standard
errors over prompts. RL that only sharpens a model's distribution moves k = 1 towards the
base's larger k and leaves large k where it was. --out writes those numbers as JSON and a
figure next to it (docs/learning/best_of_n.json, .png).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.probes.samples import KEYS, ScoredSamples, best_of, mean_se
from margrpo.training.trainer import Trainer


def best_of_figure(tables: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in zip(axes, ("aligned", "geneval_correct"), ("best world reward of k", "GenEval pass@k")):
        for model, table in tables.items():
            k, m, se = zip(*table["overall"][key])
            ax.errorbar(k, m, yerr=se, marker="o", capsize=2, label=model)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k images of the same prompt")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--models", nargs="+", required=True, help="model folders (models/base, a run's final/)")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7, help="the trainer seed whose batches every model draws")
    ap.add_argument("--group", type=int, default=0, help="images per prompt; with it, the best-of-k table too")
    ap.add_argument("--out", type=Path, help="with --group: JSON of the best-of-k numbers (a figure beside it)")
    a = ap.parse_args()
    if a.out and not a.group:
        ap.error("--out writes the best-of-k table, which needs --group N (images per prompt, e.g. 16)")
    params = params_from_args(a, fixed={"train.group_size": a.group} if a.group else None)
    prompts = read_jsonl("prompts/world_train.jsonl")
    print("| model | " + " | ".join(KEYS) + " |")
    print("|---|" + "---|" * len(KEYS))
    runs = []
    for path in a.models:
        reward = ScoredSamples(params)
        tr = Trainer.from_params(params, "grpo_frozen", a.seed, prompts, reward=reward, checkpoint=path)
        with torch.no_grad():
            for _ in range(a.batches):
                tr.collect()
        cells = [f"{m:.3f} ± {se:.3f}" for m, se in (mean_se(reward.rows, k) for k in KEYS)]
        print(f"| {path} | " + " | ".join(cells) + " |", flush=True)
        runs.append((path, reward.rows))
    (first, base), *later = runs
    for path, rows in later:
        assert [r["prompt"] for r in rows] == [r["prompt"] for r in base], "models drew different prompts"
        diff = [{"prompt": r["prompt"], **{k: r[k] - b[k] for k in KEYS}} for r, b in zip(rows, base)]
        cells = [f"{m:+.3f} ± {se:.3f}" for m, se in (mean_se(diff, k) for k in KEYS)]
        print(f"| {path} - {first} | " + " | ".join(cells) + " |", flush=True)
    if a.group:
        tables = {path: best_of(rows, a.group) for path, rows in runs}
        for key in ("aligned", "geneval_correct"):
            print(f"\n{key}, expected best of k images of a prompt (k = "
                  + ", ".join(str(c[0]) for c in tables[first]["overall"][key]) + ")")
            for path, table in tables.items():
                for purpose, cols in table.items():
                    print(f"| {path} | {purpose} | " + " | ".join(f"{m:.3f} ± {se:.3f}" for _, m, se in cols[key]) + " |")
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps({"seed": a.seed, "batches": a.batches, "group": a.group,
                                         "overrides": a.overrides, "models": tables}, indent=1) + "\n")
            best_of_figure(tables, a.out.with_suffix(".png"))


if __name__ == "__main__":
    main()

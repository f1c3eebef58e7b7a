"""The learning ladder's training rungs: does the training reward climb? (docs/learning.md)

    .venv/bin/python probes/ladder.py --rung a --method grpo_frozen --seeds 0 1 2 --steps 100 \
        [--label window2] [-S train.sde_window=2]

Rung a trains on the dense colour-share reward (`world_colour`, world/colour_reward.py),
rung b on params.yaml's own reward. Each (method, seed) trains in
outputs/ladder/<rung>/<label>/<method>_s<seed>/ with the study's trainer and no held-out
evaluation; a killed run resumes from its last checkpoint (train.checkpoint_every), and a
finished one is not retrained. After each run its curve (reward/mean per step) and its
rise go into docs/learning/rung_<rung>.json under "<label>/<method>_s<seed>": the rise is the
mean reward of the last 20% of steps minus that of the first 20% (with the standard error
of that difference from the steps' spread), the ladder's measure; a run longer than the
study's own train.steps also records the rise over its first train.steps steps
("rise_at_study_steps"), which is what rung b asks of the study. The figure
docs/learning/rung_<rung>.png draws every run of the file (10-step moving mean). Prints one
line per run.
"""
from __future__ import annotations

import json
from pathlib import Path

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.report.learning import reward_rise

DENSE = "rewards=[{name: world_colour}]"
OUT, REPORT = Path("outputs/ladder"), Path("docs/learning")


def rise(curve: list[float], frac: float = 0.2) -> tuple[float, float]:
    """(mean of the last `frac` of the curve minus the first `frac`, its standard error)."""
    r = reward_rise([{"r": x} for x in curve], max(1, round(len(curve) * frac)), key="r")
    return r["rise"], r["se"]


def figure(runs: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, run in sorted(runs.items()):
        c = run["curve"]
        smooth = [sum(c[max(0, i - 9): i + 1]) / len(c[max(0, i - 9): i + 1]) for i in range(len(c))]
        ax.plot(range(1, len(c) + 1), smooth, label=f"{key} ({run['rise']:+.3f})")
    ax.set_xlabel("training step")
    ax.set_ylabel("training reward (10-step mean)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from margrpo.training.loop import train
    from margrpo.training.trainer import Trainer

    ap = script_parser(__doc__)
    ap.add_argument("--rung", choices=("a", "b"), default="a")
    ap.add_argument("--method", default="grpo_frozen")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--label", default="default", help="names this setting in the report file")
    a = ap.parse_args()
    study_steps = params_from_args(a).train.steps
    params = params_from_args(a, before=[DENSE] if a.rung == "a" else [], fixed={
        "train.steps": a.steps, "train.eval_every": 0, "train.grad_probe_every": 0})
    prompts = read_jsonl("prompts/world_train.jsonl")
    REPORT.mkdir(parents=True, exist_ok=True)
    report = REPORT / f"rung_{a.rung}.json"
    for seed in a.seeds:
        key = f"{a.label}/{a.method}_s{seed}"
        out = OUT / a.rung / a.label / f"{a.method}_s{seed}"
        tr = Trainer.from_params(params, a.method, seed, prompts)
        train(tr, out, progress=True)
        rows = read_jsonl(out / "history.jsonl")
        curve = [r["reward/mean"] for r in rows]
        up, se = rise(curve)
        runs = json.loads(report.read_text()) if report.exists() else {}
        runs[key] = {"method": a.method, "seed": seed, "label": a.label, "overrides": a.overrides,
                     "steps": len(curve), "rise": round(up, 4), "rise_se": round(se, 4),
                     "s_per_step": round(sorted(r["time/step"] for r in rows)[len(rows) // 2], 2),
                     "curve": [round(x, 4) for x in curve]}
        if study_steps < len(curve):
            r0, s0 = rise(curve[:study_steps])
            runs[key]["rise_at_study_steps"] = {"steps": study_steps, "rise": round(r0, 4), "rise_se": round(s0, 4)}
        report.write_text(json.dumps(runs, indent=1) + "\n")
        figure(runs, REPORT / f"rung_{a.rung}.png", f"ladder rung {a.rung}: training reward")
        print(f"{key}: reward {sum(curve[:5]) / 5:.3f} -> {sum(curve[-5:]) / 5:.3f}, rise {up:+.3f} ± {se:.3f} "
              f"over {len(curve)} steps ({runs[key]['s_per_step']} s/step)", flush=True)


if __name__ == "__main__":
    main()

"""Tuning probe: train one (method, seed) with params overrides and print its held-out
learning curve (GenEval-style overall every --eval-every steps).

    .venv/bin/python probes/rl_probe.py --method mar_grpo --steps 120 --eval-every 20 \
        -S train.lr=1e-4 -S rewards.0.mode=geneval

Outside DVC and MLflow: a quick way to choose learning rates, group sizes and step counts
before a study run. It runs the study's training loop (training/loop.py) in outputs/probes/<name>/
with train.eval_every = --eval-every; evaluation uses the held-out GenEval-tag prompts with
evaluate.seed-derived image seeds (the same images for every probe at a given step count),
--images per prompt (8: about 770 images, standard error about 0.015 on the overall score).
Prints one line per evaluation with the training minutes so far (evaluation excluded) and
the mean training reward since the previous evaluation; the curve is the run's evals.jsonl.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.training.loop import train
from margrpo.training.trainer import Trainer
from margrpo.study import heldout_evaluator


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--method", default="mar_grpo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--images", type=int, default=8, help="images per held-out prompt")
    ap.add_argument("--name", default=None)
    ap.add_argument("--save", default=None, help="folder for the final policy (save_pretrained)")
    a = ap.parse_args()

    params = params_from_args(a, fixed={
        "train.steps": a.steps, "train.eval_every": a.eval_every, "train.eval_images_per_prompt": a.images})
    name = a.name or "_".join([a.method, f"s{a.seed}", *(o.replace("/", "") for o in a.overrides)])
    out = Path("outputs/probes") / name
    if out.exists():
        shutil.rmtree(out)
    metas = [m for m in read_jsonl("prompts/world_heldout.jsonl") if m.get("tag")]
    tr = Trainer.from_params(params, a.method, a.seed, read_jsonl("prompts/world_train.jsonl"))
    evaluate = heldout_evaluator(params, metas, a.images)
    clock = {"train_s": 0.0, "rewards": []}

    def log(step: int, m: dict) -> None:
        if "time/step" in m:
            clock["train_s"] += m["time/step"]
            clock["rewards"].append(m["reward/mean"])
            return
        tags = " ".join(f"{k.split('/')[-1][:6]}={v:.2f}" for k, v in m.items()
                        if k.startswith("eval/geneval/") and not k.endswith("overall"))
        rw = clock["rewards"]
        extra = f" reward {sum(rw) / len(rw):.3f}" if rw else ""
        clock["rewards"] = []
        print(f"[{name}] step {step:4d} train {clock['train_s'] / 60:5.2f} min: overall "
              f"{m['eval/geneval/overall']:.3f} ({tags}){extra}", flush=True)

    final = train(tr, out, evaluate=evaluate, log=log, progress=False)
    if a.save:
        shutil.copytree(final, a.save, dirs_exist_ok=True)


if __name__ == "__main__":
    main()

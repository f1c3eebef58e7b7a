"""Tuning probe: train one (method, seed) with params overrides and print its held-out
learning curve (GenEval-style overall every --eval-every steps).

    .venv/bin/python scripts/rl_probe.py --method mar_grpo --steps 120 --eval-every 20 \
        -S train.lr=1e-4 -S rewards.0.mode=geneval

Outside DVC and MLflow: a quick way to choose learning rates, group sizes and step counts
before a study run. Evaluation uses the held-out GenEval-tag prompts with
evaluate.seed-derived image seeds (the same images for every probe at a given step count),
--images per prompt (8: about 770 images, standard error about 0.015 on the overall score).
Prints one line per evaluation with the wall-clock training minutes so far, and writes the
curve as JSON lines to --out.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import yaml

from margrpo.config import load_params
from margrpo.eval.generate import image_seeds, sample_images, score_images, summarize
from margrpo.models.loading import load_model
from margrpo.rewards.base import build_weighted_reward
from margrpo.rl.trainer import Trainer
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.prompts import read_jsonl


def parse_overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if not _:
            raise SystemExit(f"-S expects key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def load_with_overrides(params_path: str, items: list[str], extra: dict | None = None):
    """Params from params_path with `-S key=value` overrides; list indices (rewards.0.mode)
    work as well as dict keys, and keys absent from the file are added."""
    raw = yaml.safe_load(Path(params_path).read_text())
    for key, value in parse_overrides(items).items():
        node, *path = [raw, *key.split(".")]
        for p in path[:-1]:
            node = node[int(p)] if isinstance(node, list) else node.setdefault(p, {})
        leaf = path[-1]
        if isinstance(node, list):
            node[int(leaf)] = value
        else:
            node[leaf] = value
    tmp = Path(params_path).with_name(".probe_params.yaml")
    tmp.write_text(yaml.safe_dump(raw))
    try:
        return load_params(tmp, extra or {})
    finally:
        tmp.unlink()


def heldout_overall(model, metas: list[dict], per_prompt: int, seed: int, image_size: int) -> dict[str, float]:
    seeds = image_seeds(seed, 0, len(metas), per_prompt)
    images = sample_images(model.eval(), [m["prompt"] for m in metas], seeds, 64, progress=False)
    return summarize(score_images(WorldEvaluator(image_size), images, metas))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="mar_grpo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--images", type=int, default=8, help="images per held-out prompt")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default=None, help="JSON-lines curve (default: outputs/probes/<name>.jsonl)")
    ap.add_argument("--name", default=None)
    ap.add_argument("--save", default=None, help="folder for the final policy (save_pretrained)")
    ap.add_argument("-S", dest="overrides", action="append", default=[], help="dotted key=value")
    a = ap.parse_args()

    params = load_with_overrides(a.params, a.overrides, {"train.steps": a.steps})

    name = a.name or "_".join([a.method, f"s{a.seed}", *(o.replace("/", "") for o in a.overrides)])
    out = Path(a.out or f"outputs/probes/{name}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    metas = [m for m in read_jsonl("prompts/world_heldout.jsonl") if m.get("tag")]
    torch.manual_seed(a.seed)
    policy = load_model(params.model.checkpoint, params)
    reward = build_weighted_reward(params.reward_specs())
    tr = Trainer(policy, params, params.method(a.method), a.seed, read_jsonl("prompts/world_train.jsonl"), reward)

    def evaluate(train_s: float, window: list[dict]) -> None:
        t = time.time()
        s = heldout_overall(policy, metas, a.images, params.evaluate.seed, params.world.image_size)
        row = {"step": tr.step, "train_min": train_s / 60, "eval_s": time.time() - t,
               **{k: v for k, v in s.items() if k.startswith("eval/geneval")},
               **({k: sum(w[k] for w in window) / len(window) for k in ("reward/mean", "loss/kl")} if window else {})}
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        tags = " ".join(f"{k.split('/')[-1][:6]}={v:.2f}" for k, v in s.items()
                        if k.startswith("eval/geneval/") and not k.endswith("overall"))
        extra = f" reward {row['reward/mean']:.3f} kl {row['loss/kl']:.3f}" if window else ""
        print(f"[{name}] step {tr.step:4d} train {train_s / 60:5.2f} min: overall "
              f"{s['eval/geneval/overall']:.3f} ({tags}){extra}", flush=True)

    out.unlink(missing_ok=True)
    train_s, window = 0.0, []
    evaluate(train_s, window)
    while tr.step < a.steps:
        t = time.time()
        m = tr.train_step()
        train_s += time.time() - t
        window.append(m)
        if tr.step % a.eval_every == 0 or tr.step == a.steps:
            evaluate(train_s, window)
            window = []
    if a.save:
        policy.save_pretrained(a.save)


if __name__ == "__main__":
    main()

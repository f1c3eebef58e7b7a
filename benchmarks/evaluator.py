"""Measure the world evaluator: accuracy on ground-truth renders (clean, noisy, blurred),
scores on deliberately wrong renders, and speed.

    .venv/bin/python benchmarks/evaluator.py --n-per-tag 500
"""
from __future__ import annotations

import argparse
import time

import torch
from scipy import ndimage

from margrpo.world import prompts as P
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.render import render


def degrade(images: torch.Tensor, noise: float, blur: float, seed: int) -> torch.Tensor:
    """Gaussian blur (sigma px) then additive Gaussian noise (std), clipped to [0, 1]."""
    x = images.numpy()
    if blur > 0:
        x = ndimage.gaussian_filter(x, (0, 0, blur, blur), mode="nearest")
    gen = torch.Generator().manual_seed(seed)
    return (torch.from_numpy(x) + noise * torch.randn(images.shape, generator=gen)).clamp(0, 1)


def table(rows: list[dict], scores: dict) -> dict[str, float]:
    """Per GenEval tag (0/1 accuracy) and per T2I category (mean score)."""
    acc: dict[str, list[float]] = {}
    for i, m in enumerate(rows):
        if m["tag"]:
            acc.setdefault(f"geneval/{m['tag']}", []).append(float(scores["geneval"][i]))
        if m["category"]:
            acc.setdefault(f"t2i/{m['category']}", []).append(float(scores["t2i"][i]))
    out = {k: sum(v) / len(v) for k, v in sorted(acc.items())}
    out["partial"] = float(scores["partial"].mean())
    return out


def show(title: str, res: dict[str, float]) -> None:
    print(f"{title}: " + "  ".join(f"{k}={v:.3f}" for k, v in res.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-per-tag", type=int, default=500, help="prompts per tag/category and split")
    ap.add_argument("--size", type=int, default=32, help="image size in px")
    ap.add_argument("--seed", type=int, default=0, help="seed for prompts, scenes and noise")
    args = ap.parse_args()

    rows = (P.make_prompt_set("train", args.n_per_tag, args.seed)
            + P.make_prompt_set("heldout", args.n_per_tag, args.seed + 1))
    gen = torch.Generator().manual_seed(args.seed)
    scenes = P.sample_scenes(rows, gen, size=args.size)
    ev = WorldEvaluator(args.size)
    print(f"{len(rows)} prompts ({args.n_per_tag} per purpose and split), {args.size} px")

    images = render(scenes, args.size)
    for noise, blur in [(0.0, 0.0), (0.05, 0.0), (0.1, 0.0), (0.05, 0.5), (0.1, 0.5), (0.1, 0.7)]:
        x = degrade(images, noise, blur, args.seed) if noise or blur else images
        show(f"ground truth, noise {noise}, blur {blur}", table(rows, ev.score(x, rows)))

    for kind in P.CORRUPTIONS:
        pairs = [(m, P.corrupt_scene(m, kind, gen, args.size)) for m in rows]
        pairs = [(m, s) for m, s in pairs if s is not None]
        metas = [m for m, _ in pairs]
        res = table(metas, ev.score(render([s for _, s in pairs], args.size), metas))
        show(f"wrong render {kind} ({len(metas)} prompts)", res)

    batch_scenes, batch_rows = scenes[:256], rows[:256]
    render(batch_scenes, args.size)
    t = time.perf_counter()
    imgs = render(batch_scenes, args.size)
    t_render = time.perf_counter() - t
    ev.score(imgs, batch_rows)
    t = time.perf_counter()
    ev.score(imgs, batch_rows)
    t_score = time.perf_counter() - t
    print(f"timing (256 images): render {1e3 * t_render:.1f} ms, score {1e3 * t_score:.1f} ms")


if __name__ == "__main__":
    main()

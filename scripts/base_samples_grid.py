"""Grid of 64 held-out samples of the base model: 16 prompts x 4 images, labelled.

    .venv/bin/python scripts/base_samples_grid.py [--out reports/pretrain/heldout_samples.png]

Fixed prompts (make_prompt_set("heldout", ...)) and seeds, so reruns give the same picture.
"""
from __future__ import annotations

import argparse

import torch

from margrpo.config import load_params
from margrpo.models.loading import load_model
from margrpo.world.generate import image_grid
from margrpo.world.prompts import make_prompt_set


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/pretrain/heldout_samples.png")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    params = load_params(a.params)
    model = load_model(params.model.checkpoint, params)
    metas = make_prompt_set("heldout", 2, seed=a.seed)[::2][:16]  # one prompt per purpose first
    metas += make_prompt_set("heldout", 2, seed=a.seed)[1::2][: 16 - len(metas)]
    prompts = [m["prompt"] for m in metas]
    per_image = [p for p in prompts for _ in range(4)]
    images = model.rollout(per_image, generator=torch.Generator().manual_seed(a.seed)).images.cpu()
    image_grid(images.view(len(prompts), 4, *images.shape[1:]), prompts).save(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()

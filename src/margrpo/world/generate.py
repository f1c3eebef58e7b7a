"""Sample K images per world prompt with recorded seeds, score them with the world evaluator,
and draw labelled grids. The model is any MARPolicy-like object with
`rollout(prompts, seeds=) -> .images`; nothing here imports the model code.

Seeds are a pure function of (evaluate.seed, replicate, prompt index, image index), so
every method is evaluated on the same prompts with the same per-image seeds, and a grid
row of one method shows the same seeds as the matching row of another.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from tqdm.auto import tqdm

from margrpo.world.evaluator import WorldEvaluator

_SEED_RANGE = 2**62  # per-image seeds are int64; stay well inside the range


def image_seeds(base_seed: int, replicate: int, n_prompts: int, per_prompt: int) -> torch.Tensor:
    """Per-image seeds [n_prompts, per_prompt] for one evaluation replicate."""
    gen = torch.Generator().manual_seed(base_seed * 1_000_003 + replicate)
    return torch.randint(0, _SEED_RANGE, (n_prompts, per_prompt), generator=gen, dtype=torch.long)


@torch.no_grad()
def sample_images(model, prompts: Sequence[str], seeds: torch.Tensor, batch_size: int,
                  progress: bool = True, desc: str = "sample") -> torch.Tensor:
    """Images [P, K, 3, H, W] in [0, 1], on the CPU (the pixel evaluator's input), for prompts
    [P] and seeds [P, K] (prompt-major), sampled on the model's device. An image's random
    draws depend only on its seed, not on its batch, so the batch size changes an image
    only by the float rounding of batched matmuls."""
    n_prompts, per_prompt = seeds.shape
    flat_prompts = [p for p in prompts for _ in range(per_prompt)]
    flat_seeds = seeds.reshape(-1)
    chunks = []
    for start in tqdm(range(0, len(flat_prompts), batch_size), desc=desc, disable=not progress,
                      total=math.ceil(len(flat_prompts) / batch_size), mininterval=2):
        end = start + batch_size
        chunks.append(model.rollout(flat_prompts[start:end], seeds=flat_seeds[start:end]).images.cpu())
    images = torch.cat(chunks)
    return images.reshape(n_prompts, per_prompt, *images.shape[1:])


def score_images(evaluator: WorldEvaluator, images: torch.Tensor, metadata: list[dict]) -> dict:
    """Per-image scores of images [P, K, ...]; returns the evaluator's dict over P*K images
    (prompt-major) plus the metadata rows expanded to match."""
    per_prompt = images.shape[1]
    metas = [m for m in metadata for _ in range(per_prompt)]
    scores = evaluator.score(images.reshape(-1, *images.shape[2:]), metas)
    scores["metadata"] = metas
    return scores


def summarize(scores: dict) -> dict[str, float]:
    """eval/geneval/<tag>, eval/geneval/overall, eval/t2i/<category>, eval/t2i/mean and
    eval/partial for one replicate."""
    out = WorldEvaluator.summarize(scores["metadata"], scores)
    t2i = [v for k, v in out.items() if k.startswith("eval/t2i/")]
    if t2i:
        out["eval/t2i/mean"] = sum(t2i) / len(t2i)
    return out


def image_grid(images: torch.Tensor, labels: Sequence[str], scale: int = 3, label_width: int = 260):
    """A PIL image: one row per prompt (label on the left), images [P, K, 3, H, W] upscaled
    `scale` times with nearest-neighbour so single pixels stay visible."""
    from PIL import Image, ImageDraw

    n_rows, n_cols, _, h, w = images.shape
    cell_h, cell_w, pad = h * scale, w * scale, 2
    canvas = Image.new("RGB", (label_width + n_cols * (cell_w + pad), n_rows * (cell_h + pad)), "white")
    draw = ImageDraw.Draw(canvas)
    pix = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()
    for r in range(n_rows):
        y = r * (cell_h + pad)
        draw.text((4, y + cell_h // 2 - 6), _fit(labels[r], label_width), fill="black")
        for c in range(n_cols):
            tile = Image.fromarray(pix[r, c]).resize((cell_w, cell_h), Image.NEAREST)
            canvas.paste(tile, (label_width + c * (cell_w + pad), y))
    return canvas


def grid_prompt_indices(metas: Sequence[dict], n: int) -> list[int]:
    """Up to n prompt indices for a sample grid, one per tag / category in turn (the order
    they first appear) and no prompt text twice, so the grid shows every kind of prompt
    rather than the first tag's duplicates."""
    groups: dict[str, list[int]] = {}
    seen: set[str] = set()
    for i, m in enumerate(metas):
        if m["prompt"] not in seen:
            seen.add(m["prompt"])
            groups.setdefault(str(m.get("tag") or m.get("category")), []).append(i)
    picked, queues = [], list(groups.values())
    while len(picked) < n and any(queues):
        for q in queues:
            if q and len(picked) < n:
                picked.append(q.pop(0))
    return picked


def prompt_grid(images: torch.Tensor, metas: Sequence[dict], n: int):
    """image_grid of the grid_prompt_indices rows of images [P, K, 3, H, W]."""
    idx = grid_prompt_indices(metas, n)
    return image_grid(images[idx], [metas[i]["prompt"] for i in idx])


def _fit(text: str, width_px: int, char_px: int = 6) -> str:
    limit = max(4, width_px // char_px)
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""Sample K images per world prompt with recorded seeds, summarise their scores, and draw
labelled grids. The model is any MARPolicy-like object with
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


def allocate_images(metas: Sequence[dict], per_prompt: int, per_tag: int) -> list[int]:
    """Images per prompt [P] for one evaluation replicate: per_prompt for every prompt, and
    for a headline prompt (subset not "novel") of a GenEval tag with n such prompts,
    ceil(per_tag / (n per_prompt)) times per_prompt, so every tag gets >= per_tag images and
    its prompts equal shares (a tag's mean weights its prompts alike). The standard error of
    a tag's score shrinks with its images, not its prompts, when the prompts are fixed."""
    counts: dict[str, int] = {}
    for m in metas:
        if m.get("tag") and m.get("subset") != "novel":
            counts[m["tag"]] = counts.get(m["tag"], 0) + 1
    out = []
    for m in metas:
        n = counts.get(m.get("tag"), 0) if m.get("subset") != "novel" else 0
        out.append(per_prompt * max(1, math.ceil(per_tag / (n * per_prompt))) if n and per_tag else per_prompt)
    return out


def expand_prompts(metas: Sequence[dict], per_prompt: int, per_tag: int) -> tuple[list[dict], list[int]]:
    """(rows, repeats): the prompts with each repeated allocate_images(...) / per_prompt times,
    consecutively, so that sampling per_prompt images per row gives every prompt its share;
    fold_rows(values, repeats) takes per-row scores back to per-prompt ones."""
    repeats = [n // per_prompt for n in allocate_images(metas, per_prompt, per_tag)]
    return [m for m, r in zip(metas, repeats) for _ in range(r)], repeats


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


def summarize(scores: dict) -> dict[str, float]:
    """Summary metrics of one replicate from per-image scores [P*K] and their "metadata":
    eval/geneval/<tag> and overall, eval/t2i/<category> and mean, eval/partial on the
    headline prompts (every subset but "novel"); eval/novel/... on the novel-binding prompts;
    eval/proxy/... the same rules over the training reward's detector, where the scores
    carry it (JudgedEvaluator)."""
    metas = scores["metadata"]
    parts = {"eval/": [i for i, m in enumerate(metas) if m.get("subset") != "novel"],
             "eval/novel/": [i for i, m in enumerate(metas) if m.get("subset") == "novel"]}
    out: dict[str, float] = {}
    for prefix, idx in parts.items():
        if not idx:
            continue
        sub = {k: v[idx] for k, v in scores.items() if torch.is_tensor(v)}
        rows = [metas[i] for i in idx]
        out.update(WorldEvaluator.summarize(rows, sub, prefix))
        if "proxy_geneval" in sub and prefix == "eval/":
            out.update(WorldEvaluator.summarize(rows, sub, "eval/proxy/", source="proxy_"))
    return out


def per_prompt(scores: dict, n_prompts: int, keys=("geneval", "t2i", "proxy_geneval", "proxy_t2i")) -> dict:
    """Mean over each prompt's images of the per-image scores [P*K] (prompt-major): key ->
    [P] floats, None where the prompt has no such score (no tag, no category)."""
    out = {}
    for key in keys:
        if key not in scores:
            continue
        v = scores[key].float().reshape(n_prompts, -1)                  # [P, K]
        means = v.mean(1).tolist()
        out[key] = [None if math.isnan(x) else x for x in means]
    return out


def fold_rows(values: dict, repeats: Sequence[int]) -> dict:
    """Per-row means (per_prompt over rows of a repeated prompt list) -> per-prompt means:
    key -> [P], each prompt the mean of its `repeats` consecutive rows (None stays None)."""
    out = {}
    for key, rows in values.items():
        folded, i = [], 0
        for r in repeats:
            part = [v for v in rows[i:i + r] if v is not None]
            folded.append(sum(part) / len(part) if part else None)
            i += r
        out[key] = folded
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

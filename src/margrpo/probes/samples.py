"""A policy's samples scored image by image, for the probes that compare models on the same
draws (probes/reward_transfer.py, probes/best_of_distill.py; docs/learning.md "Rung b").

`ScoredSamples` stands in for the trainer's reward: it returns the study's world reward
(the aligned score) and records, per image, its GenEval-correct and partial halves and the
dense colour share of ladder rung a. With `keep_best` it also keeps the best image of each
prompt group and serves them as a pretraining data source (margrpo.models.pretrain).
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from margrpo.rewards.base import build_reward
from margrpo.stats import expected_max, mean_var

KEYS = ("aligned", "geneval_correct", "partial", "colour_share")


class ScoredSamples:
    """Reward callable (images [B, 3, H, W], prompts [B], metas [B]) -> aligned [B]; `rows`
    holds one dict per image in call order. A batch is groups of `keep_best` consecutive
    images of one prompt (Trainer.sample_batch's layout) when keep_best > 0."""

    def __init__(self, params, keep_best: int = 0):
        spec = next((s for s in params.reward_specs() if s["name"] == "world"), None)
        if spec is None:
            raise ValueError("these probes score the world reward, which params' rewards lack: "
                             "add {name: world} to rewards (params.yaml has it)")
        self.world = build_reward("world", **{k: v for k, v in spec.items() if k not in ("name", "weight")})
        self.colour = build_reward("world_colour")
        self.keep_best = keep_best
        self.rows: list[dict] = []
        self.best_images: list[torch.Tensor] = []  # each [3, H, W] in [0, 1]
        self.best_prompts: list[str] = []
        self.best_rewards: list[float] = []

    def __call__(self, images, prompts, metas):
        aligned = self.world(images, prompts, metas)
        s = self.world.last_scores
        colour = self.colour(images, prompts, metas)
        for i, m in enumerate(metas):
            self.rows.append({"prompt": m["prompt"], "purpose": m.get("tag") or m.get("category") or "other",
                              "aligned": float(aligned[i]), "geneval_correct": float(s["correct"][i]),
                              "partial": float(s["partial"][i]), "colour_share": float(colour[i])})
        if self.keep_best:
            self._keep(images, prompts, torch.as_tensor(aligned))
        return aligned

    def _keep(self, images: torch.Tensor, prompts, aligned: torch.Tensor) -> None:
        for start in range(0, len(prompts), self.keep_best):
            best = start + int(aligned[start: start + self.keep_best].argmax())
            self.best_images.append(images[best].float().clone())
            self.best_prompts.append(prompts[best])
            self.best_rewards.append(float(aligned[best]))

    def sample(self, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, list[str]]:
        """A pretraining batch drawn with replacement from the kept images."""
        if not self.best_images:
            raise ValueError("no kept images: build ScoredSamples with keep_best > 0 and sample a batch first")
        idx = torch.randint(len(self.best_images), (batch_size,), generator=generator).tolist()
        return torch.stack([self.best_images[i] for i in idx]), [self.best_prompts[i] for i in idx]


def mean_se(rows: list[dict], key: str) -> tuple[float, float]:
    """Mean over images, and its standard error with the prompt as the sampling unit."""
    by_prompt = defaultdict(list)
    for r in rows:
        by_prompt[r["prompt"]].append(r[key])
    _, var, n = mean_var([sum(v) / len(v) for v in by_prompt.values()])
    return sum(r[key] for r in rows) / len(rows), math.sqrt(var / n)


def best_of(rows: list[dict], group: int, keys: tuple[str, ...] = ("aligned", "geneval_correct"),
            ) -> dict[str, dict[str, list[list[float]]]]:
    """{"overall" and each purpose: {key: [[k, mean, se], ...]}} for k = 1, 2, 4, ... <= group:
    per prompt group (rows in groups of `group` images of one prompt), the expected best of k
    of its images (margrpo.stats.expected_max; pass@k for 0/1 keys), averaged over the groups,
    with the standard error over groups."""
    if not rows or len(rows) % group:
        raise ValueError(f"best_of needs whole groups: {len(rows)} rows is not a multiple of group {group}")
    ks = [2 ** i for i in range(group.bit_length()) if 2 ** i <= group]
    groups = [rows[i: i + group] for i in range(0, len(rows), group)]
    out: dict[str, dict[str, list[list[float]]]] = {}
    for purpose in ["overall", *sorted({g[0]["purpose"] for g in groups})]:
        mine = [g for g in groups if purpose in ("overall", g[0]["purpose"])]
        out[purpose] = {}
        for key in keys:
            cells = []
            for k in ks:
                m, var, n = mean_var([expected_max([r[key] for r in g], k) for g in mine])
                se = math.sqrt(var / n) if n > 1 else math.nan
                cells.append([k, round(m, 4), round(se, 4)])
            out[purpose][key] = cells
    return out

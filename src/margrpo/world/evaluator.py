"""WorldEvaluator: pixel detector + GenEval / T2I-CompBench rules + a dense partial score.

score(images [B, 3, H, W], metadata) returns per-image float tensors [B]:
- "correct": 1.0 / 0.0 under GenEval's rules, for every prompt (its include / exclude /
  position clauses);
- "geneval": the same, NaN for prompts without a GenEval tag;
- "t2i": T2I-CompBench-style category score in [0, 1], NaN for prompts without a category;
- "partial": fraction of the prompt's requirements met, a denser reward than either:
  per include clause, the share of the required count found and, per named attribute,
  the share of those objects that carry it; per exclude clause, 1 if respected; per
  relation, 1 if GenEval's relation rule holds for the matched objects;
and "detections": list (per image) of Detection lists, for visualisation.
"""
from __future__ import annotations

import math
from collections import defaultdict

import torch

from margrpo.eval.detections import Detection
from margrpo.eval.geneval import (ATTRIBUTE_KEYS, geneval_correct, geneval_summary,
                                  group_detections, relative_position)
from margrpo.eval.t2i import t2i_score
from margrpo.world.detect import WorldDetector


def partial_score(meta: dict, detections: list[Detection], threshold: float = 0.3,
                  count_extras: bool = False) -> float:
    """Fraction in [0, 1] of the prompt's requirements satisfied (see module docstring).

    count_extras: one more requirement, "nothing unrequested", worth 1 / (1 + n) with n the
    confident detections not matched to any include clause (so every extra object lowers it).
    """
    objects = group_detections(detections, threshold, max_per_class=16)
    parts: list[float] = []
    chosen: list[list[Detection]] = []
    for req in meta["include"]:
        # Prefer the detections that carry the most named attributes, then confidence, so
        # that a wrong extra object does not hide a right one.
        cands = sorted(objects.get(req["class"], []),
                       key=lambda d: (-sum(d.attributes.get(k) == req[k] for k in ATTRIBUTE_KEYS if k in req),
                                      -d.score))
        found = cands[: req["count"]]
        chosen.append(found)
        parts.append(len(found) / req["count"])
        for key in ATTRIBUTE_KEYS:
            if key in req:
                parts.append(sum(d.attributes.get(key) == req[key] for d in found) / req["count"])
    for req in meta.get("exclude", []):
        parts.append(float(len(objects.get(req["class"], [])) < req["count"]))
    for i, req in enumerate(meta["include"]):
        if "position" in req:
            rel, target = req["position"]
            ok = bool(chosen[i]) and bool(chosen[target]) and all(
                rel in relative_position(a, b) for a in chosen[i] for b in chosen[target])
            parts.append(float(ok))
    if count_extras:
        used = {id(d) for found in chosen for d in found}
        extras = sum(1 for dets in objects.values() for d in dets if id(d) not in used)
        parts.append(1.0 / (1.0 + extras))
    return sum(parts) / len(parts)


def aligned_score(meta: dict, detections: list[Detection], correct: bool, threshold: float = 0.3) -> float:
    """The training reward aligned with GenEval: (correct + partial with extras) / 2.

    Its maximum, 1, needs a GenEval-correct image with nothing unrequested; a missing
    object, a wrong attribute or count, a broken relation or an extra object lowers the
    partial half even where the 0/1 half does not move, so groups keep a spread.
    """
    return 0.5 * float(correct) + 0.5 * partial_score(meta, detections, threshold, count_extras=True)


class WorldEvaluator:
    """GenEval / T2I-CompBench rules over a detector's Detections. The default detector is
    the training reward's (detect.WorldDetector); the study's evaluation passes the judge
    (judge.WorldJudge), whose detections all have score 1."""

    def __init__(self, image_size: int = 32, threshold: float = 0.3,
                 counting_threshold: float = 0.9, detector=None):
        self.detector = detector or WorldDetector(image_size)
        self.threshold = threshold
        self.counting_threshold = counting_threshold

    @torch.no_grad()
    def score(self, images: torch.Tensor, metadata: list[dict]) -> dict:
        if images.shape[0] != len(metadata):
            raise ValueError(f"{images.shape[0]} images but {len(metadata)} metadata rows")
        dets = self.detector(images)
        n = len(metadata)
        correct = torch.zeros(n)
        geneval = torch.full((n,), math.nan)
        t2i = torch.full((n,), math.nan)
        partial = torch.zeros(n)
        aligned = torch.zeros(n)
        reasons = [""] * n
        for i, (meta, d) in enumerate(zip(metadata, dets)):
            # GenEval's rules apply to every prompt's include / exclude / position clauses;
            # the "geneval" score is reported only for prompts with a GenEval tag.
            ok, reasons[i] = geneval_correct(meta, d, threshold=self.threshold,
                                             counting_threshold=self.counting_threshold)
            correct[i] = float(ok)
            if meta.get("tag"):
                geneval[i] = float(ok)
            if meta.get("category"):
                t2i[i] = t2i_score(meta, d)
            partial[i] = partial_score(meta, d, self.threshold)
            aligned[i] = aligned_score(meta, d, ok, self.threshold)
        return {"geneval": geneval, "t2i": t2i, "partial": partial, "aligned": aligned, "correct": correct,
                "detections": dets, "reasons": reasons}

    @staticmethod
    def summarize(metadata: list[dict], scores: dict, prefix: str = "eval/", source: str = "") -> dict[str, float]:
        """Flat metric dict: <prefix>geneval/<tag>, <prefix>geneval/overall (mean of tag means),
        <prefix>t2i/<category>, <prefix>t2i/mean (mean of category means) and, for the
        judge's own scores, <prefix>partial. source: "" for the scores' own detector,
        "proxy_" for the training reward's detector in a JudgedEvaluator's scores."""
        geneval, t2i = scores[f"{source}geneval"], scores[f"{source}t2i"]
        rows = [{"tag": m["tag"], "correct": float(geneval[i])} for i, m in enumerate(metadata) if m.get("tag")]
        out = {f"{prefix}geneval/{k}": v for k, v in geneval_summary(rows).items()} if rows else {}
        by_cat: dict[str, list[float]] = defaultdict(list)
        for i, meta in enumerate(metadata):
            if meta.get("category"):
                by_cat[meta["category"]].append(float(t2i[i]))
        out.update({f"{prefix}t2i/{k}": sum(v) / len(v) for k, v in by_cat.items()})
        if by_cat:
            out[f"{prefix}t2i/mean"] = sum(sum(v) / len(v) for v in by_cat.values()) / len(by_cat)
        if not source:
            out[f"{prefix}partial"] = float(torch.as_tensor(scores["partial"]).float().mean())
        return out

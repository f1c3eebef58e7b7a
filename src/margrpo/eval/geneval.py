"""GenEval's rules over Detections (protocol re-implementation, detector-agnostic).

Facts from GenEval's evaluation/evaluate_images.py and summary_scores.py
(djghosh13/geneval), re-implemented here:
- Detections per class are kept when score > 0.3 (> 0.9 when the tag is "counting"),
  sorted by confidence, at most 16 per class.
- include clauses are ANDed: a clause needs >= count detections of its class; colour
  (and, here, texture/size) is checked on the `count` most confident of them, and at
  least `count` must match. exclude clauses are ORed: a clause fails at >= count.
- position ["left of", i]: every matched object of this clause must stand in that
  relation to every matched object of clause i (whose matching must have succeeded).
  Relation of A to B: offset = centre(A) - centre(B); each axis is shrunk towards 0 by
  margin = 0.1 x (size of A + size of B) on that axis; no relation if both shrunk
  offsets are ~0; otherwise divide by the norm of the *unshrunk* offset, and
  dx < -0.5 -> "left of", dx > 0.5 -> "right of", dy < -0.5 -> "above",
  dy > 0.5 -> "below" (image y points down).
- Overall score = unweighted mean of the per-tag accuracies.
"""
from __future__ import annotations

import math
from collections import defaultdict

from margrpo.eval.detections import Detection

ATTRIBUTE_KEYS = ("color", "texture", "size")


def relative_position(a: Detection, b: Detection, margin: float = 0.1) -> set[str]:
    """Relations of a to b under GenEval's rule (see module docstring)."""
    (ax, ay), (bx, by) = a.center, b.center
    (aw, ah), (bw, bh) = a.size, b.size
    off = (ax - bx, ay - by)
    dims = (aw + bw, ah + bh)
    shrunk = [max(abs(o) - margin * d, 0.0) * math.copysign(1.0, o) for o, d in zip(off, dims)]
    if all(abs(s) < 1e-3 for s in shrunk):
        return set()
    norm = math.hypot(*off)
    dx, dy = shrunk[0] / norm, shrunk[1] / norm
    rels = set()
    if dx < -0.5:
        rels.add("left of")
    if dx > 0.5:
        rels.add("right of")
    if dy < -0.5:
        rels.add("above")
    if dy > 0.5:
        rels.add("below")
    return rels


def group_detections(detections: list[Detection], threshold: float,
                     max_per_class: int) -> dict[str, list[Detection]]:
    """class -> detections with score > threshold, most confident first, capped."""
    groups: dict[str, list[Detection]] = defaultdict(list)
    for det in sorted(detections, key=lambda d: -d.score):
        if det.score > threshold and len(groups[det.label]) < max_per_class:
            groups[det.label].append(det)
    return dict(groups)


def geneval_correct(meta: dict, detections: list[Detection], *, threshold: float = 0.3,
                    counting_threshold: float = 0.9, max_per_class: int = 16,
                    position_margin: float = 0.1) -> tuple[bool, str]:
    """(correct, reason) for one image; reason is "" when correct, else one line per
    failed clause."""
    thr = counting_threshold if meta.get("tag") == "counting" else threshold
    objects = group_detections(detections, thr, max_per_class)
    correct = True
    reasons: list[str] = []
    matched: list[list[Detection] | None] = []
    for req in meta.get("include", []):
        cls, count = req["class"], req["count"]
        found = objects.get(cls, [])[:count]
        ok = True
        if len(found) < count:
            ok = False
            reasons.append(f"expected {cls}>={count}, found {len(found)}")
        else:
            for key in ATTRIBUTE_KEYS:
                if key not in req:
                    continue
                values = [d.attributes.get(key, "unknown") for d in found]
                n_ok = values.count(req[key])
                if n_ok < count:
                    ok = False
                    seen = ", ".join(f"{values.count(v)} {v}" for v in sorted(set(values)))
                    reasons.append(f"expected {req[key]} {cls}>={count}, found {n_ok} "
                                   f"{req[key]}; and {seen}")
            if "position" in req and ok:
                rel, target = req["position"]
                targets = matched[target] if target < len(matched) else None
                if targets is None:
                    ok = False
                    reasons.append(f"no target for {cls} to be {rel}")
                else:
                    for obj in found:
                        bad = next((t for t in targets
                                    if rel not in relative_position(obj, t, position_margin)), None)
                        if bad is not None:
                            ok = False
                            found_rels = relative_position(obj, bad, position_margin)
                            reasons.append(f"expected {cls} {rel} target, found "
                                           f"{' and '.join(sorted(found_rels)) or 'no relation to'} target")
                            break
        matched.append(found if ok else None)
        correct = correct and ok
    for req in meta.get("exclude", []):
        n = len(objects.get(req["class"], []))
        if n >= req["count"]:
            correct = False
            reasons.append(f"expected {req['class']}<{req['count']}, found {n}")
    return correct, "\n".join(reasons)


def geneval_summary(rows: list[dict]) -> dict:
    """rows: {"tag", "correct"} per image -> {tag: mean, ..., "overall": mean of tag means}.
    Rows without a tag are ignored."""
    by_tag: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row.get("tag"):
            by_tag[row["tag"]].append(float(row["correct"]))
    out = {tag: sum(v) / len(v) for tag, v in by_tag.items()}
    out["overall"] = sum(out.values()) / len(out) if out else float("nan")
    return out

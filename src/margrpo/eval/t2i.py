"""T2I-CompBench-style category scores over Detections (protocol re-implementation).

Facts from T2I-CompBench (Karine-Huang/T2I-CompBench) that these rules follow:
- Attribute binding (color, shape, texture): BLIP-VQA asks one question per noun phrase
  ("a red circle?") and the image score is the product of P(yes) over the phrases.
  In the world, P(yes) for a phrase = max over detections of its class of
  detection score x the probability of each named attribute (`phrase_probability`).
- Spatial (UniDet_eval/2D_spatial_eval.py): take the first detection of each of the two
  nouns; with both found, score = 0.25 s1 + 0.25 s2 + 0.5 pos, where pos (determine_position)
  is 1 when the centre offset points the right way and dominates the other axis and the
  IoU < 0.1, iou_threshold / IoU when the boxes overlap more, else 0; with one found,
  0.25 s; with none, 0; any score < 0.5 is set to 0. So a wrong or missing relation scores 0.
- Numeracy (UniDet_eval/numeracy_eval.py): each counted phrase has weight 1/n; +0.5 w when
  its class is detected, +0.5 w more when the detected count equals the number; duplicate
  boxes of one class (IoU > 0.9 or > 90% containment) count once.
- Complex ("3-in-1", 3_in_1_eval/3_in_1.py): mean of the applicable part scores
  (attribute binding, spatial; the action part is absent in this world).
- 3D spatial (T2I-CompBench++, UniDet_eval/3D_spatial_eval.py): relations "in front of",
  "behind", "hidden" (by) between the first and last noun. A DPT-hybrid MiDaS map (relative
  inverse depth, so larger = nearer; min-max normalised per image) is averaged over each
  object's box; "in front of" needs object 1 nearer than object 2, "behind" / "hidden"
  farther. With the order right, pos = 1 when the boxes' IoU exceeds 0.5, IoU / 0.5 when
  they overlap less, 0 when they do not overlap at all (occlusion needs overlap). Score as
  2D: 0.25 s1 + 0.25 s2 + 0.5 pos with both found, 0.25 s with one, 0 with none, but no
  cut at 0.5.
"""
from __future__ import annotations

import numpy as np

from margrpo.eval.detections import Detection

SPATIAL_IOU_THRESHOLD = 0.1
SPATIAL_3D_IOU_THRESHOLD = 0.5
RELATIONS_3D = ("in front of", "behind", "hidden")
# Count words of T2I-CompBench's numeracy prompts ("two apples", "ten birds").
NUMBER_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight",
                9: "nine", 10: "ten"}


def noun_phrases(meta: dict) -> list[str]:
    """One text phrase per include clause, e.g. "a red circle", "two squares"; what a
    VQA backend asks about ("a red circle?"); plurals add an "s"."""
    out = []
    for req in meta["include"]:
        cls, n = req["class"], req["count"]
        if n > 1:
            out.append(f"{NUMBER_WORDS.get(n, str(n))} {cls}s")
        else:
            adjectives = [req[k] for k in ("size", "texture", "color") if k in req]
            article = "an" if (adjectives or [cls])[0][0] in "aeiou" else "a"
            out.append(" ".join([article, *adjectives, cls]))
    return out


def vqa_product(p_yes: list[float]) -> float:
    """BLIP-VQA image score: product of P(yes) over the noun phrases."""
    out = 1.0
    for p in p_yes:
        out *= float(p)
    return out


def attribute_probability(det: Detection, key: str, value: str) -> float:
    """P(det has attribute key == value). The detector reports one value with a
    confidence s; when it differs from the asked value, 1 - s bounds P(value)."""
    if det.attributes.get(key) is None:
        return 0.0
    s = det.attribute_scores.get(key, 1.0)
    return s if det.attributes[key] == value else 1.0 - s


def phrase_probability(req: dict, detections: list[Detection]) -> float:
    """P(yes) for the phrase of one include clause (count 1): best matching detection."""
    best = 0.0
    for det in detections:
        if det.label != req["class"]:
            continue
        p = det.score
        for key in ("color", "texture", "size"):
            if key in req:
                p *= attribute_probability(det, key, req[key])
        best = max(best, p)
    return best


def attribute_binding_score(meta: dict, detections: list[Detection]) -> float:
    return vqa_product([phrase_probability(r, detections) for r in meta["include"]])


def determine_position(relation: str, box1, box2, iou_threshold: float = SPATIAL_IOU_THRESHOLD) -> float:
    """UniDet rule: is object 1 `relation` object 2 (GenEval relation names)?"""
    c1 = (0.5 * (box1[0] + box1[2]), 0.5 * (box1[1] + box1[3]))
    c2 = (0.5 * (box2[0] + box2[2]), 0.5 * (box2[1] + box2[3]))
    dx, dy = c2[0] - c1[0], c2[1] - c1[1]   # offset from object 1 to object 2
    iou = _iou(box1, box2)
    along, across = {"left of": (dx, dy), "right of": (-dx, dy),
                     "above": (dy, dx), "below": (-dy, dx)}[relation]
    if along <= 0 or abs(along) <= abs(across):
        return 0.0
    return 1.0 if iou < iou_threshold else iou_threshold / iou


def _pair_score(meta: dict, detections: list[Detection], position) -> float:
    """UniDet's score of "A rel B" (include[1] = A with its position, include[0] = B), from
    the highest-scoring detection of each class: 0.25 s_A + 0.25 s_B + 0.5 position(rel, box_A,
    box_B) with both found, 0.25 s of the one found, else 0. Classes only, as UniDet reads."""
    b_req, a_req = meta["include"][0], meta["include"][1]
    ranked = sorted(detections, key=lambda d: -d.score)
    a = next((d for d in ranked if d.label == a_req["class"]), None)
    b = next((d for d in ranked if d.label == b_req["class"]), None)
    if a is not None and b is not None:
        return 0.25 * a.score + 0.25 * b.score + 0.5 * position(a_req["position"][0], a.box, b.box)
    if a is not None or b is not None:
        return 0.25 * (a or b).score
    return 0.0


def spatial_score(meta: dict, detections: list[Detection]) -> float:
    """UniDet 2D-spatial score for "A rel B"; scores under 0.5 count as 0, as in UniDet."""
    score = _pair_score(meta, detections, determine_position)
    return score if score >= 0.5 else 0.0


def mean_box_depth(depth, box, transposed: bool = False) -> float:
    """Mean of a depth map [H, W] over box (x0, y0, x1, y1), in the map's pixels; corners
    truncated to int as the official crop does. NaN for an empty crop (so no order holds).
    transposed=True reads depth[x0:x1, y0:y1] as the official script does (it indexes the
    [H, W] map with x first); the default reads the box itself."""
    d = np.asarray(depth, dtype=np.float64)
    x0, y0, x1, y1 = (max(int(v), 0) for v in box)
    crop = d[x0:x1, y0:y1] if transposed else d[y0:y1, x0:x1]
    return float(crop.mean()) if crop.size else float("nan")


def depth_position(relation: str, box1, box2, depth, iou_threshold: float = SPATIAL_3D_IOU_THRESHOLD,
                   transposed: bool = False) -> float:
    """Is object 1 `relation` ("in front of" / "behind" / "hidden") object 2? depth: [H, W],
    larger = nearer the camera (MiDaS / DPT relative inverse depth). In [0, 1]."""
    if relation not in RELATIONS_3D:
        raise ValueError(f"3D relation {relation!r}; expected one of {RELATIONS_3D}")
    nearer = mean_box_depth(depth, box1, transposed) - mean_box_depth(depth, box2, transposed)
    ordered = nearer > 0 if relation == "in front of" else nearer < 0  # NaN -> False
    iou = _iou(box1, box2)
    if not ordered or iou <= 0:
        return 0.0
    # official: IoU > threshold -> 1; at exactly the threshold it gives 0 (we give 1)
    return 1.0 if iou >= iou_threshold else iou / iou_threshold


def spatial3d_score(meta: dict, detections: list[Detection], depth, transposed: bool = False) -> float:
    """UniDet 3D-spatial score for "A rel B" (include[1] = A with its position, include[0] = B;
    the same meta layout as spatial_score), depth [H, W] in the boxes' pixel frame. No 0.5 cut."""
    return _pair_score(meta, detections,
                       lambda rel, box_a, box_b: depth_position(rel, box_a, box_b, depth, transposed=transposed))


def numeracy_score(meta: dict, detections: list[Detection], threshold: float = 0.3) -> float:
    """UniDet numeracy score: per counted phrase, half credit for presence, half for the
    exact count (after merging duplicate boxes)."""
    kept: list[Detection] = []
    for det in sorted(detections, key=lambda d: -d.score):
        if det.score > threshold and not any(k.label == det.label and _duplicate(k.box, det.box) for k in kept):
            kept.append(det)
    reqs = meta["include"]
    score = 0.0
    for req in reqs:
        n = sum(d.label == req["class"] for d in kept)
        if n:
            score += 0.5 / len(reqs)
            if n == req["count"]:
                score += 0.5 / len(reqs)
    return score


def complex_score(parts: dict[str, float]) -> float:
    """3-in-1: mean of the applicable parts (e.g. {"attribute": .., "spatial": ..})."""
    if not parts:
        raise ValueError("complex_score needs at least one part score")
    return sum(parts.values()) / len(parts)


def t2i_score(meta: dict, detections: list[Detection], depth=None) -> float:
    """Score in [0, 1] for meta["category"] (3d_spatial also needs the depth map [H, W])."""
    cat = meta.get("category")
    if cat in ("color", "shape", "texture"):
        return attribute_binding_score(meta, detections)
    if cat == "spatial":
        return spatial_score(meta, detections)
    if cat == "numeracy":
        return numeracy_score(meta, detections)
    if cat == "3d_spatial":
        if depth is None:
            raise ValueError("category '3d_spatial' needs a depth map (t2i_score(..., depth=))")
        return spatial3d_score(meta, detections, depth)
    if cat == "complex":
        parts = {"attribute": attribute_binding_score(meta, detections)}
        if any("position" in r for r in meta["include"]):
            parts["spatial"] = spatial_score(meta, detections)
        return complex_score(parts)
    raise ValueError(f"no T2I-CompBench rule for category {cat!r}; "
                     "expected color, shape, texture, spatial, 3d_spatial, numeracy or complex")


def _area(b) -> float:
    return max(b[2] - b[0], 0.0) * max(b[3] - b[1], 0.0)


def _intersection(a, b) -> float:
    return _area((max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])))


def _iou(a, b) -> float:
    inter = _intersection(a, b)
    union = _area(a) + _area(b) - inter
    return inter / union if union > 0 else 0.0


def _duplicate(a, b) -> bool:
    inter = _intersection(a, b)
    return (_iou(a, b) > 0.9 or inter > 0.9 * max(_area(a), 1e-9)
            or inter > 0.9 * max(_area(b), 1e-9))

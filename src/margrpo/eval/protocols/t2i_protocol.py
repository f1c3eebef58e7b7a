"""T2I-CompBench over real images (protocol re-implementation).

Images in T2I-CompBench's layout: one folder per category holding "{prompt}_{index:06d}.png"
(the prompt is the file name before the last "_"; images are ordered by index, which is
the question_id). Per category:
  color / shape / texture: BLIP-VQA P(yes) of "{noun phrase}?" per phrase, combined by the
      rules' vqa_product; phrases are split on " and " / "," (official: spaCy noun chunks).
  spatial / numeracy: the detector's Detections of the prompt's nouns, scored by the rules'
      spatial_score / numeracy_score on a parsed include list.
  non_spatial: CLIP cosine of image and prompt.
  complex: the rules' complex_score over {"vqa", "clip", and "spatial" when the prompt has a
      left/right/top/bottom relation}.
  3d_spatial: "A in front of / behind / hidden by B": the detector's Detections of A and B
      plus the depth backend's map (image size, larger = nearer), scored by the rules'
      spatial3d_score. Differences from the official script: head nouns of the two sides
      instead of spaCy's first / last noun, no girl/boy/man/woman -> "person" mapping (an
      open-vocabulary detector is asked for the word itself), the highest-scoring detection
      of each class, and a float depth map at image size instead of an 8-bit PNG.
Output per category: <out>/<category>/<annotation dir>/vqa_result.json, a list of
{"question_id", "answer"} as the official scripts write, plus <out>/t2i_summary.json.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from margrpo.eval import t2i
from margrpo.eval.t2i import NUMBER_WORDS

LABEL = "protocol re-implementation (not the official T2I-CompBench scorer)"
ANNOTATION_DIR = {"color": "annotation_blip", "shape": "annotation_blip", "texture": "annotation_blip",
                  "spatial": "annotation_obj_detection_2d", "numeracy": "annotation_num",
                  "non_spatial": "annotation_clip", "complex": "annotation_3_in_1",
                  "3d_spatial": "annotation_obj_detection_3d"}
RELATIONS = {"left": "left of", "right": "right of", "top": "above", "bottom": "below"}
NUMBERS = {"a": 1, "an": 1, "one": 1, **{word: n for n, word in NUMBER_WORDS.items()}}
SPATIAL_RE = re.compile(r"^(?P<a>.+?) on (?:the )?(?P<rel>left|right|top|bottom) of (?P<b>.+)$")
SPATIAL_3D_RE = re.compile(r"^(?P<a>.+?) (?P<rel>in front of|behind|hidden by) (?P<b>.+)$")


def list_images(folder: str | Path) -> list[tuple[int, str, Path]]:
    """(question_id, prompt, path), ordered by the trailing index of the file name."""
    items = []
    for p in Path(folder).glob("*.png"):
        prompt, _, idx = p.stem.rpartition("_")
        items.append((int(idx), prompt, p))
    items.sort(key=lambda t: t[0])
    return [(i, prompt, p) for i, (_, prompt, p) in enumerate(items)]


def split_phrases(prompt: str) -> list[str]:
    parts = re.split(r",\s*|\s+and\s+", prompt.strip().rstrip("."))
    return [p.strip() for p in parts if p.strip()]


def head_noun(phrase: str) -> str:
    return phrase.strip().rstrip(".").split()[-1]


def singular(word: str) -> str:
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if re.search(r"(ses|xes|ches|shes)$", word):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def parse_spatial(prompt: str) -> dict | None:
    """"A on the left of B" -> rules' meta: include[0] = B, include[1] = A with position."""
    m = SPATIAL_RE.match(prompt.strip().rstrip("."))
    if not m:
        return None
    a, b = head_noun(m["a"]), head_noun(m["b"])
    return {"category": "spatial", "prompt": prompt,
            "include": [{"class": b, "count": 1},
                        {"class": a, "count": 1, "position": [RELATIONS[m["rel"]], 0]}]}


def parse_spatial_3d(prompt: str) -> dict | None:
    """"A hidden by B" -> rules' meta: include[0] = B, include[1] = A with its 3D relation."""
    m = SPATIAL_3D_RE.match(prompt.strip().rstrip("."))
    if not m:
        return None
    rel = "hidden" if m["rel"] == "hidden by" else m["rel"]
    return {"category": "3d_spatial", "prompt": prompt,
            "include": [{"class": head_noun(m["b"]), "count": 1},
                        {"class": head_noun(m["a"]), "count": 1, "position": [rel, 0]}]}


def parse_numeracy(prompt: str) -> dict:
    include = []
    for phrase in split_phrases(prompt):
        words = phrase.split()
        count = NUMBERS.get(words[0].lower(), 1) if words else 1
        include.append({"class": singular(head_noun(phrase)), "count": count})
    return {"category": "numeracy", "prompt": prompt, "include": include}


def score_prompt(category: str, prompt: str, image, vqa=None, detector=None, clip=None,
                 depth=None) -> float | None:
    """One image's score in [0, 1] (None when the prompt has no parse for its rule)."""
    if category in ("color", "shape", "texture"):
        return t2i.vqa_product(vqa.p_yes(image, [f"{p}?" for p in split_phrases(prompt)]))
    if category == "non_spatial":
        return clip.cosine(image, prompt)
    if category == "spatial":
        meta = parse_spatial(prompt)
        if meta is None:
            return None
        nouns = [r["class"] for r in meta["include"]]
        return t2i.spatial_score(meta, detector.detect(image, nouns))
    if category == "3d_spatial":
        meta = parse_spatial_3d(prompt)
        if meta is None:
            return None
        dmap = depth.depth(image)  # [H, W], the image's pixel frame, as the boxes
        if tuple(dmap.shape) != (image.height, image.width):
            raise ValueError(f"depth map {tuple(dmap.shape)} is not the image size {(image.height, image.width)}")
        return t2i.spatial3d_score(meta, detector.detect(image, [r["class"] for r in meta["include"]]), dmap)
    if category == "numeracy":
        meta = parse_numeracy(prompt)
        nouns = sorted({r["class"] for r in meta["include"]})
        return t2i.numeracy_score(meta, detector.detect(image, nouns))
    if category == "complex":
        parts = {}
        if vqa is not None:
            parts["vqa"] = t2i.vqa_product(vqa.p_yes(image, [f"{p}?" for p in split_phrases(prompt)]))
        if clip is not None:
            parts["clip"] = clip.cosine(image, prompt)
        meta = parse_spatial(prompt)
        if meta is not None and detector is not None:
            parts["spatial"] = t2i.spatial_score(meta, detector.detect(image, [r["class"] for r in meta["include"]]))
        return t2i.complex_score(parts)
    raise ValueError(f"unknown T2I-CompBench category {category!r}; expected one of {sorted(ANNOTATION_DIR)}")


def run_category(category: str, image_folder: str | Path, out_dir: str | Path,
                 vqa=None, detector=None, clip=None, depth=None) -> dict:
    """Score one category folder; write the official-format vqa_result.json."""
    from PIL import Image

    results, skipped = [], 0
    for qid, prompt, path in list_images(image_folder):
        s = score_prompt(category, prompt, Image.open(path).convert("RGB"), vqa, detector, clip, depth)
        if s is None:
            skipped += 1
            continue
        results.append({"question_id": qid, "answer": float(s)})
    target = Path(out_dir) / category / ANNOTATION_DIR[category]
    target.mkdir(parents=True, exist_ok=True)
    (target / "vqa_result.json").write_text(json.dumps(results, indent=1))
    mean = sum(r["answer"] for r in results) / len(results) if results else float("nan")
    return {"category": category, "score": mean, "n_images": len(results), "skipped_unparsed": skipped}


def run_t2i(image_root: str | Path, out_dir: str | Path, categories: list[str] | None = None,
            vqa=None, detector=None, clip=None, depth=None) -> dict:
    """image_root/<category>/ folders -> per-category results and t2i_summary.json.
    depth: a DepthEstimator-like backend, needed for 3d_spatial only."""
    root = Path(image_root)
    cats = categories or [c for c in ANNOTATION_DIR if (root / c).is_dir()]
    if "3d_spatial" in cats and (depth is None or detector is None):
        raise ValueError("3d_spatial needs a detector and a depth backend (run_t2i(..., detector=, "
                         "depth=DepthEstimator(<local DPT folder>))); pass them or leave 3d_spatial out")
    summary = {"label": LABEL, "categories": {}}
    for cat in cats:
        summary["categories"][cat] = run_category(cat, root / cat, out_dir, vqa, detector, clip, depth)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "t2i_summary.json").write_text(json.dumps(summary, indent=2))
    return summary

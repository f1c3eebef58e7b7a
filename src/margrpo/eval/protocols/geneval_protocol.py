"""GenEval over real images (protocol re-implementation).

Images in GenEval's layout: <image_root>/<prompt index, 5 digits>/metadata.jsonl (the
prompt's metadata row) and <...>/samples/<nnnn>.png. For each image: the detector finds
objects of the 80 COCO classes; for every include clause that names a colour, each detected
object of that class gets its colour from the attribute scorer (CLIP, 10 colours) on its box
crop (official GenEval uses Mask2Former masks; boxes here); then margrpo.eval.geneval's
rules decide correctness. Output: results.jsonl with GenEval's row fields, readable by
GenEval's summary_scores.py, plus summary.json (per-tag means and "overall").
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from margrpo.eval.detections import Detection
from margrpo.jsonl import read_jsonl, write_jsonl

LABEL = "protocol re-implementation (not the official GenEval scorer)"
COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]


def data_dir(name: str = "geneval") -> Path:
    """data/<name> of a margrpo checkout: the working directory's, else the checkout this
    package runs from (an editable install). An installed wheel carries no data/, so pass
    the file paths explicitly there (load_class_names(path), run_geneval(class_names=))."""
    here = Path(__file__).resolve()
    candidates = [Path.cwd() / "data" / name] + [p / "data" / name for p in here.parents
                                                 if (p / "pyproject.toml").is_file()]
    for folder in candidates:
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        f"data/{name} not found (looked in {', '.join(str(c) for c in candidates)}); run from a "
        "margrpo checkout, or pass the file explicitly (e.g. load_class_names(<object_names.txt>))")


def load_class_names(path: str | Path | None = None) -> list[str]:
    """GenEval's 80 COCO class names, one per line (default: data/geneval/object_names.txt)."""
    path = Path(path) if path else data_dir("geneval") / "object_names.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: GenEval class-name list not found; pass its path")
    return [l.strip() for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]


def add_colors(image, meta: dict, detections: list[Detection], scorer) -> list[Detection]:
    """Detections with attributes["color"] set for classes whose include clause names one."""
    wanted = {r["class"] for r in meta.get("include", []) if "color" in r}
    out = []
    for d in detections:
        if d.label in wanted:
            x0, y0, x1, y1 = (int(round(v)) for v in d.box)
            crop = image.crop((max(0, x0), max(0, y0), max(x0 + 1, x1), max(y0 + 1, y1)))
            color, conf = scorer.classify(crop, d.label, COLORS)
            d = Detection(d.label, d.score, d.box, {**d.attributes, "color": color},
                          {**d.attribute_scores, "color": conf})
        out.append(d)
    return out


def score_image(image, meta: dict, detector, color_scorer, class_names: list[str],
                **rule_kwargs: Any) -> tuple[bool, str, list[Detection]]:
    from margrpo.eval.geneval import geneval_correct

    dets = detector.detect(image, class_names)
    if color_scorer is not None:
        dets = add_colors(image, meta, dets, color_scorer)
    correct, reason = geneval_correct(meta, dets, **rule_kwargs)
    return correct, reason, dets


def result_row(filename: str, meta: dict, correct: bool, reason: str, dets: list[Detection]) -> dict:
    """One results.jsonl row with GenEval's field names; metadata/details are JSON strings."""
    details: dict[str, list] = {}
    for d in dets:
        details.setdefault(d.label, []).append(
            {"score": round(d.score, 4), "box": [round(v, 1) for v in d.box], **d.attributes})
    return {"filename": filename, "tag": meta["tag"], "prompt": meta["prompt"],
            "correct": bool(correct), "reason": reason, "metadata": json.dumps(meta),
            "details": json.dumps(details)}


def run_geneval(image_root: str | Path, out_dir: str | Path, detector, color_scorer=None,
                class_names: list[str] | None = None, **rule_kwargs: Any) -> dict:
    """Score every image under image_root; write out_dir/results.jsonl and summary.json."""
    from PIL import Image

    from margrpo.eval.geneval import geneval_summary

    class_names = class_names or load_class_names()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for folder in sorted(p for p in Path(image_root).iterdir() if p.is_dir()):
        meta = read_jsonl(folder / "metadata.jsonl")[0]
        for png in sorted((folder / "samples").glob("*.png")):
            image = Image.open(png).convert("RGB")
            correct, reason, dets = score_image(image, meta, detector, color_scorer, class_names, **rule_kwargs)
            rows.append(result_row(str(png), meta, correct, reason, dets))
    write_jsonl(rows, out_dir / "results.jsonl")
    summary = {"label": LABEL, "n_images": len(rows), **geneval_summary(rows)}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary

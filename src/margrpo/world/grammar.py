"""The embedded world's language: vocabulary, attributes, prompt text <-> metadata.

A prompt is one of a few fixed sentence patterns over noun phrases
("a [size] [texture] [colour] shape" or "<number> shapes"), joined by "and" or by a
relation. Its metadata follows GenEval's schema, extended with "texture", "size" and a
T2I-CompBench "category":

    {"prompt": str, "tag": GenEval tag | None, "category": T2I category | None,
     "include": [{"class", "count", ["color"], ["texture"], ["size"], ["position"]}],
     "exclude": [{"class", "count"}]}

Conventions taken from GenEval's prompts/create_prompts.py: counting prompts carry
include count n and exclude count n+1 (so the count is exact); a relation prompt
"A rel B" lists B first and gives A "position": [rel, 0] ("A is rel of include[0]").

Purpose of each prompt (exactly one tag-or-category purpose; `purpose_of`):
- GenEval tags: single_object, two_object, counting, colors, position, color_attr.
- T2I-CompBench categories: color, shape, texture, spatial, complex, numeracy.
- T2I categories by form: color / shape / texture = two phrases joined by "and", each with
  exactly a colour / a size / a texture; spatial = "A on the left of B" with no attributes
  or a colour on both; complex = any other mix of attributes, with or without a relation;
  numeracy = two phrases with counts ("two circles and a square").
- A color_attr prompt ("a red circle and a blue square") is word for word a T2I "color"
  prompt, so it carries both tag color_attr and category color. Everything else carries one.
  Numeracy is kept apart from counting by using two counted noun phrases
  ("two circles and a square"); a single counted phrase is GenEval counting.
- T2I non_spatial is not generated: this world has no actions or interactions between
  objects, so there is nothing a non-spatial relation could describe.
"""
from __future__ import annotations

from typing import Any

SHAPES = ("circle", "square", "triangle", "diamond", "ring", "cross", "semicircle", "rectangle")
PLURALS = {s: s + ("es" if s.endswith("s") else "s") for s in SHAPES}
# Eight saturated colours, chosen so that every pair is at least 23 CIEDE2000 units apart
# (orange - red and purple - blue are the closest pairs) and directions of (1 - rgb), which is
# what a pixel keeps when blurred into the white background, at least 14 degrees apart.
# Every colour has one channel <= 0.2, so every object, including its dark stripes, sits far
# from the white background.
COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "orange": (1.00, 0.50, 0.025),
    "yellow": (0.95, 0.85, 0.10),
    "green": (0.10, 0.70, 0.20),
    "cyan": (0.10, 0.75, 0.85),
    "blue": (0.05, 0.35, 0.70),
    "purple": (0.50, 0.00, 0.90),
    "pink": (0.95, 0.20, 0.65),
}
TEXTURES = ("solid", "striped")
SIZES = ("small", "large")
NUMBERS = {"two": 2, "three": 3, "four": 4}
NUMBER_WORDS = {v: k for k, v in NUMBERS.items()}
MAX_OBJECTS = 4

# Canonical relations are GenEval's; T2I-CompBench spells the same four differently.
RELATIONS = ("left of", "right of", "above", "below")
T2I_RELATIONS = {
    "left of": "on the left of",
    "right of": "on the right of",
    "above": "on the top of",
    "below": "on the bottom of",
}
GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
T2I_CATEGORIES = ("color", "shape", "texture", "spatial", "complex", "numeracy")
ATTRIBUTES = ("color", "texture", "size")

# The model's prompt vocabulary: pad and null (the CFG prompt) first, as
# margrpo.models.tokenizer.WordTokenizer expects, then every word a prompt can use.
PAD, NULL = "<pad>", "<null>"
_WORDS = (
    ["a", "and", "on", "the", "of", "left", "right", "top", "bottom", "above", "below"]
    + list(NUMBERS) + list(SIZES) + list(TEXTURES) + list(COLORS)
    + list(SHAPES) + list(PLURALS.values())
)
VOCAB: list[str] = [PAD, NULL] + _WORDS
_WORD_ID = {w: i for i, w in enumerate(VOCAB)}
_SINGULAR = {p: s for s, p in PLURALS.items()}
_ADJ_KIND = {**{c: "color" for c in COLORS}, **{t: "texture" for t in TEXTURES},
             **{s: "size" for s in SIZES}}


def phrase(req: dict[str, Any]) -> str:
    """Text of one include entry: "a large striped red circle" or "three triangles"."""
    if req["count"] > 1:
        return f"{NUMBER_WORDS[req['count']]} {PLURALS[req['class']]}"
    adjectives = [req[k] for k in ("size", "texture", "color") if k in req]
    return " ".join(["a", *adjectives, req["class"]])


def purpose_of(include: list[dict[str, Any]], relation_style: str | None) -> tuple[str | None, str | None]:
    """(tag, category) of a prompt from its include list; relation_style is None (joined by
    "and"), "geneval" or "t2i". Raises ValueError for a combination with no purpose."""
    kinds = [{k for k in ATTRIBUTES if k in r} for r in include]
    all_kinds = set().union(*kinds)
    counts = [r["count"] for r in include]
    if len(include) == 1:
        if counts[0] > 1:
            return "counting", None
        if not all_kinds:
            return "single_object", None
        if all_kinds == {"color"}:
            return "colors", None
        raise ValueError("a single-object prompt may carry a colour only (GenEval 'colors')")
    if max(counts) > 1:
        if relation_style is not None or all_kinds:
            raise ValueError("counted phrases take no attributes or relations (numeracy)")
        return None, "numeracy"
    if relation_style == "geneval":
        if all_kinds:
            raise ValueError("GenEval position prompts carry no attributes; "
                             "use 'on the left of' (T2I spatial/complex) instead")
        return "position", None
    if relation_style == "t2i":
        return (None, "spatial") if all_kinds <= {"color"} and kinds[0] == kinds[1] else (None, "complex")
    if not all_kinds:
        return "two_object", None
    for kind, cat in (("color", "color"), ("size", "shape"), ("texture", "texture")):
        if kinds[0] == kinds[1] == {kind}:
            return ("color_attr", "color") if kind == "color" else (None, cat)
    return None, "complex"


def prompt_text(meta: dict[str, Any]) -> str:
    """Canonical sentence for metadata (the inverse of parse_prompt)."""
    inc = meta["include"]
    if len(inc) == 2 and "position" in inc[1]:
        rel = inc[1]["position"][0]
        word = rel if meta.get("tag") == "position" else T2I_RELATIONS[rel]
        return f"{phrase(inc[1])} {word} {phrase(inc[0])}"
    return " and ".join(phrase(r) for r in inc)


def make_meta(include: list[dict[str, Any]], relation_style: str | None = None) -> dict[str, Any]:
    """Full metadata from include entries (relation, if any, already on include[1]):
    adds tag, category, exact-count excludes and the prompt text."""
    if len(include) > 2 or not include:
        raise ValueError("prompts have one or two noun phrases")
    if len({r["class"] for r in include}) != len(include):
        raise ValueError("the two noun phrases of a prompt must name different shapes")
    if sum(r["count"] for r in include) > MAX_OBJECTS:
        raise ValueError(f"at most {MAX_OBJECTS} objects fit the 2x2 grid")
    tag, category = purpose_of(include, relation_style)
    exclude = [{"class": r["class"], "count": r["count"] + 1} for r in include if r["count"] > 1]
    meta = {"prompt": "", "tag": tag, "category": category,
            "include": [dict(r) for r in include], "exclude": exclude}
    meta["prompt"] = prompt_text(meta)
    return meta


def _parse_phrase(words: list[str], text: str) -> dict[str, Any]:
    if not words:
        raise ValueError(f"missing noun phrase in {text!r}")
    det, *rest = words
    if not rest:
        raise ValueError(f"noun phrase {' '.join(words)!r} lacks a shape in {text!r}")
    *adjectives, noun = rest
    if det in NUMBERS:
        if noun not in _SINGULAR:
            raise ValueError(f"expected a plural shape ({', '.join(PLURALS.values())}) after "
                             f"{det!r}, got {noun!r} in {text!r}")
        if adjectives:
            raise ValueError(f"counted phrases take no adjectives: {' '.join(words)!r}")
        return {"class": _SINGULAR[noun], "count": NUMBERS[det]}
    if det != "a":
        raise ValueError(f"a noun phrase starts with 'a' or a number word "
                         f"({', '.join(NUMBERS)}), got {det!r} in {text!r}")
    if noun not in SHAPES:
        raise ValueError(f"unknown shape {noun!r} in {text!r}; shapes: {', '.join(SHAPES)}")
    req: dict[str, Any] = {"class": noun, "count": 1}
    for adj in adjectives:
        kind = _ADJ_KIND.get(adj)
        if kind is None:
            raise ValueError(f"unknown attribute {adj!r} in {text!r}; colours: {', '.join(COLORS)}; "
                             f"textures: {', '.join(TEXTURES)}; sizes: {', '.join(SIZES)}")
        if kind in req:
            raise ValueError(f"two {kind} attributes in one phrase of {text!r}")
        req[kind] = adj
    return req


def parse_prompt(text: str) -> dict[str, Any]:
    """Metadata for a prompt of the grammar; ValueError naming the offending word otherwise."""
    words = text.split()
    for w in words:
        if w not in _WORD_ID or w in (PAD, NULL):
            raise ValueError(f"unknown word {w!r} in prompt {text!r}; vocabulary: {_WORDS}")
    joined = " ".join(words)
    for rel in RELATIONS:
        for style, spelled in (("t2i", T2I_RELATIONS[rel]), ("geneval", rel)):
            marker = f" {spelled} "
            if marker in joined:
                subject, obj = joined.split(marker, 1)
                a = _parse_phrase(subject.split(), text)
                b = _parse_phrase(obj.split(), text)
                a["position"] = [rel, 0]
                meta = make_meta([b, a], style)
                return _checked(meta, text)
    parts = joined.split(" and ")
    meta = make_meta([_parse_phrase(p.split(), text) for p in parts])
    return _checked(meta, text)


def _checked(meta: dict[str, Any], text: str) -> dict[str, Any]:
    # Attribute order is fixed (size, texture, colour) so that each combination has one text.
    if meta["prompt"] != " ".join(text.split()):
        raise ValueError(f"prompt {text!r} is not in canonical form; expected {meta['prompt']!r}")
    return meta

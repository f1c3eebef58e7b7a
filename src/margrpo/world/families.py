"""Families of near-miss scenes: each family sweeps one parameter of a scene that a judge
can get wrong (how stretched, notched, star-like, how far between two hues, how faint an
extra object, how much two objects overlap, where on the pixel grid a correct object
sits), with every case's true verdict given by an independent rule on the painted
geometry and colours, never by a detector.

The rule says what a careful person would answer, and says nothing where a person would
hesitate: each family has a pass band and a fail band of its parameter, and the values
between them are "ambiguous" (truth None) and left out of the rates. The bands (BANDS)
are the rule; they are written before any judge is run on the cases.

A hue between two world colours is judged as a person sees it: its CIE 1976 colour
difference in CIELAB (D65 white) from the prompted colour, as a share of the difference
between the prompted colour and its perceptually nearest world colour (the case's
`measure`; the bands apply to it instead of the painted mixing share).

    cases = family_cases(seed=0)            # >= 300 FamilyCase, deterministic in the seed
    table = family_rates(cases, verdicts)   # per family: false accepts / fails, false rejects / passes

benchmarks/judge.py --families prints the judge's and the training reward's rates.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from margrpo.world.grammar import COLORS, PLURALS, SHAPES
from margrpo.world.paint import SUPERSAMPLE, Paint, coverage, paint
from margrpo.world.perceptual import delta_e, nearest_other
from margrpo.world.render import SIZE_FRACTION, Scene, SceneObject, max_jitter, render

SIZE = 32
CELL = SIZE / 2
HALF = {s: SIZE_FRACTION[s] * CELL / 2 for s in SIZE_FRACTION}  # half-sides in px: small, large
CENTRES = ((8.0, 8.0), (24.0, 8.0), (8.0, 24.0), (24.0, 24.0))   # (cx, cy) of the grid's cells

# family -> (parameter, values swept, pass band, fail band): the truth rule. A value in
# neither band is ambiguous. Bands are closed intervals [lo, hi].
BANDS: dict[str, tuple[str, tuple[float, ...], tuple[float, float] | None, tuple[float, float] | None]] = {
    # shapes: a world shape changed until it is none
    "stretched": ("aspect ratio", (1.0, 1.05, 1.1, 1.2, 1.3, 1.4, 1.6), (1.0, 1.05), (1.3, 9.0)),
    "star": ("inner / outer radius", (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9), None, (0.0, 0.7)),
    "heart": ("half-side px", (HALF["small"], 5.5, HALF["large"]), None, (0.0, 99.0)),
    "notch": ("corner notch side / side", (0.0, 0.1, 0.2, 0.3, 0.4, 0.5), (0.0, 0.1), (0.3, 1.0)),
    "bite": ("bite radius / radius", (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8), (0.0, 0.2), (0.5, 1.0)),
    "hole": ("hole radius / radius", (0.0, 0.15, 0.25, 0.35, 0.45, 0.55), (0.0, 0.15), (0.35, 1.0)),
    "wedge": ("wedge angle deg", (0.0, 15.0, 30.0, 45.0, 60.0, 90.0), (0.0, 15.0), (45.0, 360.0)),
    # colours: what colour a person names
    "hue_between": ("perceptual share of the way to the nearest colour", (0.0, 0.1, 0.2, 0.3, 0.4, 0.5),
                    (0.0, 0.15), (0.4, 1.0)),
    "desaturated": ("share of grey", (0.0, 0.15, 0.3, 0.45, 0.6, 0.75), (0.0, 0.15), (0.6, 1.0)),
    "pale_part": ("area share painted pale in another colour", (0.0, 0.1, 0.25, 0.4, 0.55, 0.7), (0.0, 0.1),
                  (0.4, 1.0)),
    "mixture": ("area share of the prompted colour", (1.0, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5), (0.85, 1.0),
                (0.0, 0.65)),
    # counting: an extra object a person counts, or not
    "overlap_extra": ("overlap px", (0.0, 1.0, 2.0, 3.0, 4.0), None, (0.0, 3.0)),
    "faint_extra": ("contrast (alpha)", (0.05, 0.1, 0.2, 0.3, 0.45, 0.7), (0.0, 0.05), (0.3, 1.0)),
    "corner_cut": ("visible share", (0.15, 0.3, 0.5, 0.7, 0.9), None, (0.5, 1.0)),
    # correct scenes a judge must not reject
    "touching_pair": ("gap px (negative: overlap)", (2.0, 1.0, 0.0, -1.0), (-1.0, 9.0), None),
    "subpixel": ("offset px", (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875), (0.0, 1.0), None),
    "world_render": ("jitter px", (0.0, 1.0, 2.0), (0.0, 9.0), None),
}
FAMILIES = tuple(BANDS)
REPEATS = 20  # scenes per family and value (colours, shapes, cells and sizes drawn per scene)


@dataclass(frozen=True)
class FamilyCase:
    """One scene of a family at one value of its parameter; truth: the rule's verdict on the
    prompt (None: ambiguous, in no band). `objects` are painted; a world_render case holds
    its world Scene instead and is drawn by the world's renderer."""

    family: str
    value: float
    prompt: str
    objects: tuple[Paint, ...] = ()
    scene: Scene | None = None
    measure: float | None = None  # what the bands apply to, when not the swept value

    @property
    def truth(self) -> bool | None:
        _, _, ok, bad = BANDS[self.family]
        x = self.value if self.measure is None else self.measure
        if ok is not None and ok[0] <= x <= ok[1]:
            return True
        if bad is not None and bad[0] <= x <= bad[1]:
            return False
        return None

    def image(self) -> torch.Tensor:
        """[3, SIZE, SIZE] in [0, 1]."""
        if self.scene is not None:
            return render([self.scene], SIZE)[0]
        return paint(list(self.objects), SIZE)


# ---- builders: one scene per (value, repeat) ----------------------------------------------

def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _at(cell: int, shape: str, r: float, color, **kw) -> Paint:
    cx, cy = CENTRES[cell]
    return Paint(shape, cx, cy, r, color, **kw)


def _shape_case(family: str, v: float, rng: np.random.Generator) -> FamilyCase:
    color, cell, size = _pick(rng, tuple(COLORS)), int(rng.integers(4)), _pick(rng, ("small", "large"))
    r = HALF[size]
    if family == "stretched":
        shape = _pick(rng, ("circle", "square", "diamond"))
        obj = _at(cell, shape, r / math.sqrt(v), color, aspect=v)  # the area of the unstretched shape
    elif family == "star":
        shape, obj = "circle", _at(cell, "star", r, color, inner=v)
    elif family == "heart":
        shape, obj = _pick(rng, ("circle", "triangle")), _at(cell, "heart", v, color)
    elif family == "notch":
        shape, obj = "square", _at(cell, "square", r, color, cut=v, cut_kind="notch")
    elif family == "bite":
        shape, obj = "circle", _at(cell, "circle", r, color, cut=v, cut_kind="bite")
    elif family == "hole":
        shape = _pick(rng, ("circle", "square"))
        obj = _at(cell, shape, HALF["large"], color, cut=v, cut_kind="hole")
    else:  # wedge
        shape, obj = "circle", _at(cell, "circle", HALF["large"], color, cut=v, cut_kind="wedge")
    return FamilyCase(family, v, f"a {color} {shape}", (obj,))


def _colour_case(family: str, v: float, rng: np.random.Generator) -> FamilyCase:
    name, shape, cell = _pick(rng, tuple(COLORS)), _pick(rng, SHAPES), int(rng.integers(4))
    base, other = np.array(COLORS[name]), np.array(COLORS[nearest_other(name)])
    r, kw, measure = HALF["large"], {}, None
    if family == "hue_between":
        color = tuple((1 - v) * base + v * other)
        measure = delta_e(base, color) / delta_e(base, other)
    elif family == "desaturated":
        grey = np.full(3, base.mean())
        color = tuple((1 - v) * base + v * grey)
    elif family == "pale_part":  # the part right of the split is the other colour, pale
        pale = tuple(1 - 0.45 * (1 - other))
        color, kw = name, {"color2": pale, "split": 1 - v}
    else:  # mixture: the prompted colour on the left of the object, a full other colour right
        color, kw = name, {"color2": nearest_other(name), "split": v}
    obj = _at(cell, shape, r, color, **kw)
    if family in ("pale_part", "mixture"):  # the bands apply to shares of the area, not of the width
        share = area_share(obj)
        measure = 1 - share if family == "pale_part" else share
    return FamilyCase(family, v, f"a {name} {shape}", (obj,), measure=measure)


def area_share(obj: Paint) -> float:
    """Share of a two-colour object's painted area in its first colour (left of its split)."""
    cov = coverage(obj, SIZE)
    sub = (np.arange(SIZE * SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    left = ((sub - obj.cx) / obj.aspect < obj.r * (2 * obj.split - 1)).astype(float)
    return float((cov * left.reshape(SIZE, SUPERSAMPLE).mean(1)[None, :]).sum() / cov.sum())


def _count_case(family: str, v: float, rng: np.random.Generator) -> FamilyCase:
    shape, color = ("square" if family == "corner_cut" else _pick(rng, SHAPES)), _pick(rng, tuple(COLORS))
    r = HALF["small"]
    two = [_at(0, shape, r, color), _at(3, shape, r, color)]
    prompt = f"two {PLURALS[shape]}"
    if family == "overlap_extra":  # a third one overlapping the second by v px from the right
        cx, cy = CENTRES[3]
        extra = Paint(shape, cx - 2 * r + v, cy, r, color)
    elif family == "faint_extra":  # a third one, faint, in the cell beside a bright one
        extra = _at(1, shape, r, color, alpha=v)
    else:  # corner_cut: a third square cut by the image's top-right corner, `v` of it visible
        side = 2 * HALF["large"]
        vis = side * math.sqrt(v)  # both sides cut alike
        extra = Paint(shape, SIZE - vis + side / 2, vis - side / 2, HALF["large"], color)
    return FamilyCase(family, v, prompt, (*two, extra))


def _correct_case(family: str, v: float, rng: np.random.Generator) -> FamilyCase:
    shape, color = _pick(rng, SHAPES), _pick(rng, tuple(COLORS))
    if family == "touching_pair":
        other = _pick(rng, [s for s in SHAPES if s != shape])
        color2 = _pick(rng, [c for c in COLORS if c != color])
        r = HALF["large"]
        a = Paint(shape, 16 - r - v / 2, 16.0, r, color)
        b = Paint(other, 16 + r + v / 2, 16.0, r, color2)
        return FamilyCase(family, v, f"a {color} {shape} and a {color2} {other}", (a, b))
    size = _pick(rng, ("small", "large"))
    if family == "subpixel":
        cell, angle = int(rng.integers(4)), rng.uniform(0, 2 * math.pi)
        dx, dy = v * math.cos(angle), v * math.sin(angle)
        cx, cy = CENTRES[cell]
        obj = Paint(shape, cx + dx, cy + dy, HALF[size], color, striped=bool(rng.integers(2)))
        return FamilyCase(family, v, f"a {color} {shape}", (obj,))
    # world_render: the world's own renderer at jitter v (clipped to what the world allows)
    cell, texture = (int(rng.integers(2)), int(rng.integers(2))), _pick(rng, ("solid", "striped"))
    j = min(int(v), max_jitter(SIZE, size))
    jitter = (j * int(rng.choice((-1, 1))), j * int(rng.choice((-1, 1))))
    scene = Scene([SceneObject(shape, color, texture, size, cell, jitter)])
    return FamilyCase(family, v, f"a {color} {shape}", scene=scene)


_BUILDERS = {**{f: _shape_case for f in ("stretched", "star", "heart", "notch", "bite", "hole", "wedge")},
             **{f: _colour_case for f in ("hue_between", "desaturated", "pale_part", "mixture")},
             **{f: _count_case for f in ("overlap_extra", "faint_extra", "corner_cut")},
             **{f: _correct_case for f in ("touching_pair", "subpixel", "world_render")}}


def family_cases(seed: int = 0, repeats: int = REPEATS) -> list[FamilyCase]:
    """Every family at every value of its parameter, `repeats` scenes each (colours, shapes,
    cells and sizes drawn from one numpy generator seeded with `seed`)."""
    rng = np.random.default_rng(seed)
    return [_BUILDERS[f](f, v, rng) for f in FAMILIES for v in BANDS[f][1] for _ in range(repeats)]


def family_rates(cases: list[FamilyCase], verdicts) -> dict[str, dict[str, float]]:
    """Per family: fails (truth False), false_accepts (verdict True there), passes (truth True),
    false_rejects (verdict False there), ambiguous (left out); rates as fractions (NaN when
    the family has no case of that truth)."""
    out = {}
    for f in FAMILIES:
        rows = [(c.truth, bool(v)) for c, v in zip(cases, verdicts) if c.family == f]
        fails = [v for t, v in rows if t is False]
        passes = [v for t, v in rows if t is True]
        out[f] = {"fails": len(fails), "false_accepts": sum(fails), "passes": len(passes),
                  "false_rejects": sum(not v for v in passes),
                  "ambiguous": sum(t is None for t, _ in rows),
                  "fa_rate": sum(fails) / len(fails) if fails else math.nan,
                  "fr_rate": sum(not v for v in passes) / len(passes) if passes else math.nan}
    return out

"""Constructed images that a cheap detector misreads, each with the verdict GenEval's rules
give its true scene: shapes outside the world's family, faint / tiny / edge-cut / stretched
extra objects, two-colour objects, correct renders off the pixel grid, touching objects,
blur and noise. benchmarks/judge.py prints the judge's and the training reward's verdict
on every case; tests/test_judge.py requires the judge to agree with the truth on all.

The truth of a case comes from what was painted, never from a detector: an object's class
is its shape when that shape is one of the world's and unstretched, else "other"; its
colour is the one covering at least 75% of it ("mixed" otherwise, "other" off the palette);
size and texture as painted; its box is where it covers at least half a pixel.

Not in the set: shapes that 32 px cannot tell from a world shape. A regular hexagon as
wide as a large circle (13 px) overlaps the best-fitting circle's pixels with IoU 0.96, as
much as a noisy circle does; at that size a hexagon is a circle to a pixel-level judge.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from margrpo.eval.detections import Detection
from margrpo.eval.geneval import geneval_correct
from margrpo.world.grammar import COLORS, SHAPES, parse_prompt
from margrpo.world.paint import SUPERSAMPLE, Paint, coverage, paint
from margrpo.world.render import SIZE_FRACTION

SIZE = 32
SMALL, LARGE = SIZE_FRACTION["small"] * SIZE / 4, SIZE_FRACTION["large"] * SIZE / 4   # half-sides, px
CELLS = ((8.0, 8.0), (24.0, 8.0), (8.0, 24.0), (24.0, 24.0))   # (cx, cy) of the 2x2 grid's cells
COLOR_SHARE = 0.75


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                  # what the case probes (a column of the table)
    prompt: str
    objects: tuple[Paint, ...]
    blur: float = 0.0
    noise: float = 0.0
    seed: int = 0
    note: str = ""

    def image(self) -> torch.Tensor:
        return paint(list(self.objects), SIZE, self.blur, self.noise, self.seed)

    def truth(self) -> list[Detection]:
        return [d for d in (_true_detection(o) for o in self.objects) if d is not None]

    def verdict(self) -> bool:
        """GenEval's verdict on the true scene."""
        return geneval_correct(parse_prompt(self.prompt), self.truth())[0]


def _true_detection(obj: Paint) -> Detection | None:
    cov = coverage(obj, SIZE)
    seen = cov >= 0.5
    if not seen.any():
        return None
    ys, xs = np.nonzero(seen)
    label = obj.shape if obj.shape in SHAPES and obj.aspect == 1.0 else "other"
    return Detection(label, 1.0, (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)),
                     attributes={"color": _true_colour(obj, cov), "texture": "striped" if obj.striped else "solid",
                                 "size": "large" if 2 * obj.r * max(obj.aspect, 1.0) / (SIZE / 2)
                                 >= 0.5 * sum(SIZE_FRACTION.values()) else "small"})


def _true_colour(obj: Paint, cov: np.ndarray) -> str:
    sub = (np.arange(SIZE * SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    left = ((sub - obj.cx) / obj.aspect < obj.r * (2 * obj.split - 1)).astype(float)
    share = float((cov * left.reshape(SIZE, SUPERSAMPLE).mean(1)[None, :]).sum() / cov.sum())
    if obj.color2 is None or share >= COLOR_SHARE:
        name = obj.color
    elif share <= 1 - COLOR_SHARE:
        name = obj.color2
    else:
        return "mixed"
    return name if isinstance(name, str) and name in COLORS else "other"


def _at(cell: int, shape: str, r: float = LARGE, color="red", dx: float = 0.0, dy: float = 0.0, **kw) -> Paint:
    cx, cy = CELLS[cell]
    return Paint(shape, cx + dx, cy + dy, r, color, **kw)


def cases() -> list[Case]:
    """The adversarial set (50 cases)."""
    c: list[Case] = []

    def add(name, kind, prompt, objects, **kw):
        c.append(Case(name, kind, prompt, tuple(objects), **kw))

    # Shapes outside the family, asked as world shapes.
    for name, shape, color, prompt in [
            ("diamond_for_circle", "diamond", "red", "a red circle"),
            ("down_triangle_for_circle", "down_triangle", "red", "a red circle"),
            ("down_triangle_for_triangle", "down_triangle", "red", "a red triangle"),
            ("plus_for_circle", "plus", "red", "a red circle"),
            ("star_for_square", "star", "blue", "a blue square"),
            ("arrow_for_triangle", "arrow", "green", "a green triangle"),
            ("ring_for_circle", "ring", "purple", "a purple circle"),
            ("right_triangle_for_triangle", "right_triangle", "yellow", "a yellow triangle"),
            ("crescent_for_circle", "crescent", "cyan", "a cyan circle"),
            ("semicircle_for_circle", "semicircle", "green", "a circle")]:
        add(name, "foreign shape", prompt, [_at(0, shape, color=color)])
    add("rectangle_for_square", "stretched", "a square", [_at(0, "square", color="blue", aspect=1.6, r=5.0)])
    add("ellipse_for_circle", "stretched", "a circle", [_at(0, "circle", color="green", aspect=1.5, r=5.0)])

    # Extra objects that must be counted (or, when not of the class, must not).
    three = [_at(k, "square", SMALL, "blue") for k in (0, 1, 3)]
    add("three_squares_faint_fourth", "faint extra", "three squares", three + [_at(2, "square", SMALL, "blue", alpha=0.3)])
    add("three_squares_cut_fourth", "edge-cut extra", "three squares",
        three + [Paint("square", 2.0, 24.0, LARGE, "blue")], note="a third of the fourth square is off the image")
    add("three_squares_rectangle", "stretched extra", "three squares",
        three + [_at(2, "square", 4.0, "blue", aspect=1.6)], note="a rectangle is not a square: correct")
    add("three_squares_tiny_fourth", "tiny extra", "three squares", three + [_at(2, "square", 2.5, "blue")])
    add("two_circles_faint_third", "faint extra", "two circles",
        [_at(0, "circle", SMALL, "red"), _at(3, "circle", SMALL, "red"), _at(1, "circle", SMALL, "red", alpha=0.3)])
    add("two_diamonds_faint_third", "faint extra", "two diamonds",
        [_at(0, "diamond", LARGE, "cyan"), _at(3, "diamond", LARGE, "cyan"), _at(2, "diamond", LARGE, "cyan", alpha=0.3)])
    add("circle_faint_square", "faint extra", "a circle", [_at(0, "circle"), _at(3, "square", alpha=0.3)],
        note="extra objects are allowed")
    add("four_triangles_noisy", "noise", "four triangles",
        [_at(k, "triangle", SMALL, "green") for k in range(4)], noise=0.06, seed=1)

    # Colour: most of the object, or not its colour.
    add("circle_60_40_red", "two-colour", "a red circle", [_at(0, "circle", color="red", color2="blue", split=0.6)])
    add("circle_60_40_blue", "two-colour", "a blue circle", [_at(0, "circle", color="red", color2="blue", split=0.6)])
    add("circle_92_8_red", "two-colour", "a red circle", [_at(0, "circle", color="red", color2="blue", split=0.92)])
    add("square_two_colour_shape", "two-colour", "a square", [_at(0, "square", color="red", color2="green", split=0.5)])
    add("striped_red_circle", "texture", "a red circle", [_at(0, "circle", color="red", striped=True)])
    add("blue_for_purple", "colour", "a purple circle", [_at(0, "circle", color="blue")])
    add("grey_for_red", "colour", "a red circle", [_at(0, "circle", color=(0.45, 0.45, 0.45))])
    add("pale_yellow", "faint object", "a yellow circle", [_at(0, "circle", color="yellow", alpha=0.5)])

    # Correct renders off the pixel grid.
    for i, (shape, r, color, cell, dx, dy) in enumerate([
            ("circle", SMALL, "red", 0, 0.25, 0.5), ("square", LARGE, "blue", 1, -0.4, 0.3),
            ("triangle", SMALL, "green", 2, 0.4, -0.3), ("diamond", LARGE, "yellow", 3, 0.3, 0.45),
            ("circle", LARGE, "purple", 0, 0.5, 0.5), ("triangle", LARGE, "cyan", 1, -0.25, 0.25),
            ("square", SMALL, "red", 2, 0.33, 0.66), ("diamond", SMALL, "blue", 1, 0.1, -0.2)]):
        add(f"offgrid_{shape}_{i}", "sub-pixel offset", f"a {color} {shape}", [_at(cell, shape, r, color, dx, dy)])

    # Touching objects.
    add("touching_circle_square", "touching", "a red circle and a blue square",
        [Paint("circle", 10.0, 16.0, 5.5, "red"), Paint("square", 21.0, 16.0, 5.5, "blue")])
    add("touching_two_circles", "touching", "two circles",
        [Paint("circle", 10.0, 16.0, 5.5, "green"), Paint("circle", 21.0, 16.0, 5.5, "green")])
    add("touching_left_of", "touching", "a circle left of a square",
        [Paint("circle", 10.0, 16.0, 5.5, "red"), Paint("square", 21.0, 16.0, 5.5, "red")])

    # Blur and noise on correct scenes.
    add("blurred_triangle", "blur", "a green triangle", [_at(2, "triangle", color="green")], blur=0.7)
    add("noisy_pair", "noise", "a purple square and a yellow circle",
        [_at(0, "square", color="purple"), _at(3, "circle", color="yellow")], noise=0.08, seed=2)
    add("blurred_noisy_diamonds", "blur + noise", "two diamonds",
        [_at(1, "diamond", color="red"), _at(2, "diamond", color="red")], blur=0.5, noise=0.05, seed=3)

    # Relations, sizes and textures.
    add("left_of_swapped", "relation", "a circle left of a square", [_at(0, "square"), _at(1, "circle")])
    add("sizes_right", "size", "a large circle and a small square", [_at(0, "circle", LARGE), _at(3, "square", SMALL)])
    add("sizes_swapped", "size", "a large circle and a small square", [_at(0, "circle", SMALL), _at(3, "square", LARGE)])
    add("textures_right", "texture", "a striped circle and a solid square",
        [_at(0, "circle", striped=True), _at(3, "square", color="green")])
    add("textures_swapped", "texture", "a striped circle and a solid square",
        [_at(0, "circle"), _at(3, "square", color="green", striped=True)])
    add("huge_square", "scale", "a square", [Paint("square", 16.0, 16.0, 9.0, "blue")],
        note="larger than a cell: still a square")

    # Nothing there.
    add("empty", "empty", "a circle", [])
    add("noise_only", "empty", "a square", [], noise=0.1, seed=4)
    return c

"""Anti-aliased painter for constructed scenes: the world's shapes and shapes outside it, at
any sub-pixel position and scale, faint, two-coloured, stretched or cut by the image edge,
then blurred and noised. The world's own renderer (render.py) draws only what the grammar
can ask for, pixel-aligned; this one draws what a generator might produce instead, to test
the evaluation judge and the training reward against the true scene (world/adversarial.py).

Coverage of a pixel = share of its SUPERSAMPLE x SUPERSAMPLE sub-pixel centres inside the
shape; a pixel's colour = white mixed with the object's colour by coverage x alpha, so a
blurred or partial edge pixel keeps the direction of (1 - rgb), as in the world renderer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from margrpo.world.grammar import COLORS, SHAPES
from margrpo.world.render import STRIPE_DARKNESS, inside

SUPERSAMPLE = 8
# Shapes outside the world's family, as implicit functions of the offset (dx, dy) from the
# centre (y down) and the half-extent r; aspect stretches x (dx is divided by it).
FOREIGN = ("down_triangle", "plus", "star", "arrow", "right_triangle", "crescent", "hexagon",
           "ellipse", "heart")
# Pieces cut out of a shape (Paint.cut_kind), sized by Paint.cut: a square notch at the
# top-right corner (side cut x the box side), a bite at the right edge (radius cut x r), a
# centred hole (radius cut x r, the shape's own outline), a wedge pointing right (angle cut
# in degrees).
CUTS = ("notch", "bite", "hole", "wedge")


def _foreign_inside(shape: str, dx: np.ndarray, dy: np.ndarray, r: float, inner: float = 0.45) -> np.ndarray:
    ax, ay = np.abs(dx), np.abs(dy)
    box = (ax <= r) & (ay <= r)
    if shape == "down_triangle":
        return box & (ax <= (r - dy) / 2)
    if shape == "plus":   # arms a third of the extent wide
        return box & ((ax <= r / 3) | (ay <= r / 3))
    if shape == "star":   # five points: radius between inner x r and r by angle
        ang = np.arctan2(dy, dx) + np.pi / 2
        rad = r * (inner + (1 - inner) * np.abs(np.cos(2.5 * ang)) ** 3)
        return dx**2 + dy**2 <= rad**2
    if shape == "heart":  # two lobes over a point down, in the box of half-side r
        lobes = ((np.abs(dx) - 0.48 * r) ** 2 + (dy + 0.42 * r) ** 2 <= (0.52 * r) ** 2)
        point = (dy >= -0.42 * r) & (dy <= r) & (ax <= 0.98 * (r - dy) * 0.72)
        return box & (lobes | point)
    if shape == "arrow":  # an upward arrow: a head over a shaft
        head = (dy <= 0) & (ax <= (dy + r))
        shaft = (dy > 0) & (dy <= r) & (ax <= r / 3)
        return box & (head | shaft)
    if shape == "right_triangle":  # right angle at the bottom left
        return box & (dx - (-r) <= (dy - (-r)))
    if shape == "crescent":
        return (dx**2 + dy**2 <= r**2) & ((dx - 0.5 * r) ** 2 + dy**2 > (0.8 * r) ** 2)
    if shape == "hexagon":  # flat top and bottom
        return (ay <= 0.866 * r) & (0.866 * ax + 0.5 * ay <= 0.866 * r)
    if shape == "ellipse":  # stretched by aspect before the call
        return dx**2 + dy**2 <= r**2
    raise ValueError(f"unknown shape {shape!r}; world shapes: {SHAPES}; others: {FOREIGN}")


def _cut_out(kind: str, shape: str, dx: np.ndarray, dy: np.ndarray, r: float, cut: float) -> np.ndarray:
    """The region a cut of `kind` and size `cut` removes from a shape of half-side r."""
    if kind == "notch":
        side = cut * 2 * r
        return (dx >= r - side) & (dy <= -r + side)
    if kind == "bite":
        return (dx - r) ** 2 + dy**2 <= (cut * r) ** 2
    if kind == "hole":
        return inside(SHAPES.index(shape), dx, dy, cut * r) if shape in SHAPES else dx**2 + dy**2 <= (cut * r) ** 2
    if kind == "wedge":
        return (np.abs(np.degrees(np.arctan2(dy, dx))) <= cut / 2) & (dx**2 + dy**2 > 0)
    raise ValueError(f"unknown cut {kind!r}; cuts: {CUTS}")


@dataclass(frozen=True)
class Paint:
    """One object. cx, cy: centre in px (image coordinates, may lie off the canvas);
    r: half the bounding-box side in px; aspect: x stretch (> 1 wider); color: a world
    colour name or an RGB triple; color2 / split: the part left of the vertical line at
    `split` of the object's width gets `color`, the rest `color2`; alpha: contrast against white (1 =
    full colour, 0.3 = faint); striped: the world's horizontal bands; inner: a star's inner
    radius over its outer; cut_kind, cut: a piece cut out (CUTS)."""

    shape: str
    cx: float
    cy: float
    r: float
    color: str | tuple[float, float, float] = "red"
    aspect: float = 1.0
    color2: str | tuple[float, float, float] | None = None
    split: float = 1.0
    alpha: float = 1.0
    striped: bool = False
    inner: float = 0.45  # star only: inner radius / outer radius
    cut_kind: str | None = None  # a piece cut out of the shape (CUTS), of size `cut`
    cut: float = 0.0


def _rgb(color) -> np.ndarray:
    return np.asarray(COLORS[color] if isinstance(color, str) else color, dtype=np.float64)


def coverage(obj: Paint, size: int) -> np.ndarray:
    """[size, size] share of each pixel inside the object, in [0, 1]."""
    sub = (np.arange(size * SUPERSAMPLE) + 0.5) / SUPERSAMPLE          # sub-pixel centres, px
    dy = sub[:, None] - obj.cy
    dx = (sub[None, :] - obj.cx) / obj.aspect
    if obj.shape in SHAPES:
        m = inside(SHAPES.index(obj.shape), dx, dy, obj.r)
    else:
        m = _foreign_inside(obj.shape, dx, dy, obj.r, obj.inner)
    if obj.cut_kind is not None and obj.cut > 0:
        m = m & ~_cut_out(obj.cut_kind, obj.shape, dx, dy, obj.r, obj.cut)
    return m.reshape(size, SUPERSAMPLE, size, SUPERSAMPLE).mean((1, 3))


def paint(objects: list[Paint], size: int = 32, blur: float = 0.0, noise: float = 0.0,
          seed: int = 0) -> torch.Tensor:
    """One image [3, size, size] in [0, 1]: objects painted in order over white, then a
    Gaussian blur of `blur` px and Gaussian noise of std `noise` (from `seed`)."""
    img = np.ones((3, size, size))
    sub = (np.arange(size * SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    for obj in objects:
        cov = coverage(obj, size) * obj.alpha                          # [H, W]
        left = (sub[None, :] - obj.cx) / obj.aspect < obj.r * (2 * obj.split - 1)
        share1 = np.broadcast_to(left, (size * SUPERSAMPLE,) * 2).reshape(
            size, SUPERSAMPLE, size, SUPERSAMPLE).mean((1, 3))       # [H, W] share of colour 1
        c1, c2 = _rgb(obj.color), _rgb(obj.color2 if obj.color2 is not None else obj.color)
        color = share1[None] * c1[:, None, None] + (1 - share1[None]) * c2[:, None, None]
        if obj.striped:   # bands phase-locked to image rows, as in the world renderer
            band = max(1, size // 16)
            dark = (np.arange(size) // band) % 2 == 1
            color = color * np.where(dark, STRIPE_DARKNESS, 1.0)[None, :, None]
        img = img * (1 - cov[None]) + color * cov[None]
    if blur > 0:
        img = ndimage.gaussian_filter(img, (0, blur, blur), mode="nearest")
    if noise > 0:
        img = img + noise * np.random.default_rng(seed).standard_normal(img.shape)
    return torch.from_numpy(np.clip(img, 0, 1).astype(np.float32))

"""Vectorised renderer of world scenes: flat shapes on a white canvas, one object per cell
of a 2x2 grid.

Geometry at size H (cell = H/2 px): an object's "diameter" d (bounding-box side) is
0.55 cell (small) or 0.80 cell (large; 0.8 rather than 0.85 so that neighbours keep a
3-px gap at 32 px, which a blurred generated image does not bridge). A circle has radius d/2,
a square side d, a triangle points up with base d and height d, a diamond has diagonals d,
a ring is a circle with a hole of half its radius, a cross is a plus sign with bars d/3
wide, a semicircle (flat side left) and a rectangle stand upright, d tall and d/2 wide
(`inside`). A pixel belongs to a shape when its centre does (hard
edges: a pixel-patch model learns them easily and the detector reads them exactly).
Striped objects alternate horizontal bands of the colour and the colour x 0.45, each band
H/16 rows (period 4 px at 32 px), phase-locked to image rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from margrpo.world.grammar import COLORS, SHAPES

SIZE_FRACTION = {"small": 0.55, "large": 0.80}
STRIPE_DARKNESS = 0.45
RING_HOLE = 0.5    # a ring's hole radius / its outer radius
CROSS_ARM = 1 / 3  # a cross's bar half-width / its half-side
COLOR_NAMES = tuple(COLORS)
COLOR_TABLE = np.array([COLORS[c] for c in COLOR_NAMES], dtype=np.float32)  # [C, 3] RGB in [0, 1]


@dataclass(frozen=True)
class SceneObject:
    """One object. cell = (row, col) in the 2x2 grid; jitter = (dy, dx) in pixels."""

    shape: str
    color: str
    texture: str
    size: str
    cell: tuple[int, int]
    jitter: tuple[int, int] = (0, 0)


@dataclass
class Scene:
    objects: list[SceneObject] = field(default_factory=list)


def check_size(size: int) -> int:
    if size < 8 or size % 2:
        raise ValueError(f"image size must be an even number >= 8 (2x2 grid of cells), got {size}")
    return size


def max_jitter(size: int, obj_size: str) -> int:
    """Largest |jitter| (px) that keeps the object one pixel inside its cell.

    The world allows up to H/16; large objects would then touch their neighbours, which
    merges them into one connected component, so their jitter shrinks (to 0 at 32 px).
    The extra 0.5 px is the centre offset of odd-width shapes (see render).
    """
    cell = size / 2
    room = int((cell - SIZE_FRACTION[obj_size] * cell) / 2 - 1.5)
    return max(0, min(size // 16, room))


def _circle(dx, dy, r):
    return dx**2 + dy**2 <= r**2


def _square(dx, dy, r):
    return (np.abs(dy) <= r) & (np.abs(dx) <= r)


def _triangle(dx, dy, r):   # half-width grows from 0 at the apex (dy = -r) to r at the base
    return (np.abs(dy) <= r) & (np.abs(dx) <= (dy + r) / 2)


def _diamond(dx, dy, r):
    return np.abs(dx) + np.abs(dy) <= r


def _ring(dx, dy, r):   # a disc with a centred hole of half its radius
    d2 = dx**2 + dy**2
    return (d2 <= r**2) & (d2 >= (RING_HOLE * r) ** 2)


def _cross(dx, dy, r):  # an upright cross (plus sign): two bars of width 2 * CROSS_ARM * r
    ax, ay = np.abs(dx), np.abs(dy)
    return (ax <= r) & (ay <= r) & ((ax <= CROSS_ARM * r) | (ay <= CROSS_ARM * r))


def _semicircle(dx, dy, r):  # the right half of a disc of radius r, flat side left; box r wide, 2r tall
    return (np.abs(dx) <= r / 2) & ((dx + r / 2) ** 2 + dy**2 <= r**2)


def _rectangle(dx, dy, r):   # standing: r wide, 2r tall
    return (np.abs(dx) <= r / 2) & (np.abs(dy) <= r)


_INSIDE = (_circle, _square, _triangle, _diamond, _ring, _cross, _semicircle, _rectangle)   # order of SHAPES
# Box width / box height of each shape (order of SHAPES): the half-disc and the rectangle stand
# upright, so that a small one still spans four stripe bands (a flat one would span two).
BOX_WIDTH = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5], dtype=np.float32)


def inside(shape, dx, dy, r):
    """Whether the point (dx, dy) px from an object's centre (y down) lies inside the shape:
    the one geometric definition of the world's shapes, shared by the renderer and the
    evaluation judge's templates. shape: index into SHAPES (an int, or an array per point);
    r: half the bounding-box side (px). Arrays broadcast against each other.

    circle: radius r; square: side 2r; triangle: points up, base 2r and height 2r; diamond:
    the square turned by 45 degrees with its corners on the box's edge midpoints; ring: the
    circle less a centred disc of radius RING_HOLE r; cross: a plus sign of two bars 2r long
    and 2 CROSS_ARM r wide; semicircle: the right half of a disc of radius r, flat side left,
    centred on its box (r wide, 2r tall); rectangle: r wide, 2r tall.
    """
    if isinstance(shape, (int, np.integer)):
        return _INSIDE[shape](dx, dy, r)
    shape = np.asarray(shape)
    return np.select([shape == k for k in range(len(_INSIDE))], [f(dx, dy, r) for f in _INSIDE], False)


def render(scenes: list[Scene], size: int = 32) -> torch.Tensor:
    """Images [B, 3, size, size], float32 in [0, 1], white background.

    Every object stays inside its own cell (max_jitter), so shapes are rasterised on
    [O, cell, cell] windows and written into a [B, 2, 2, 3, cell, cell] grid of cells.
    numpy, not torch: small elementwise ops on 2 busy CPU threads are ~10x faster
    single-threaded.
    """
    check_size(size)
    cell = size // 2
    cells = np.ones((len(scenes), 2, 2, 3, cell, cell), dtype=np.float32)
    objs = [(b, o) for b, s in enumerate(scenes) for o in s.objects]
    if objs:
        bidx = np.array([b for b, _ in objs])
        row = np.array([o.cell[0] for _, o in objs])
        col = np.array([o.cell[1] for _, o in objs])
        d = np.array([SIZE_FRACTION[o.size] * cell for _, o in objs], dtype=np.float32)  # [O] px
        # A shape about n px wide is centred on a pixel centre when n is odd and on a pixel
        # corner when n is even, so its rasterisation is symmetric (a 9-px circle centred
        # on a corner would come out as an 8x8 square with clipped corners).
        shape = np.array([SHAPES.index(o.shape) for _, o in objs])
        cy = np.array([cell / 2 + o.jitter[0] for _, o in objs], dtype=np.float32) + 0.5 * (np.round(d) % 2)
        cx = np.array([cell / 2 + o.jitter[1] for _, o in objs], dtype=np.float32) + 0.5 * (np.round(d * BOX_WIDTH[shape]) % 2)
        r = d / 2
        color = COLOR_TABLE[[COLOR_NAMES.index(o.color) for _, o in objs]]    # [O, 3]
        striped = np.array([o.texture == "striped" for _, o in objs])

        grid = np.arange(cell, dtype=np.float32) + 0.5   # pixel centres within a cell
        dy = grid[None, :, None] - cy[:, None, None]       # [O, cell, 1]
        dx = grid[None, None, :] - cx[:, None, None]       # [O, 1, cell]
        mask = inside(shape[:, None, None], dx, dy, r[:, None, None])  # [O, cell, cell]

        # Stripe bands are phase-locked to image rows (not to the object), so the pattern
        # is the same in every 8x8 patch a pixel-patch model sees.
        band = max(1, size // 16)
        image_rows = row[:, None] * cell + np.arange(cell)[None, :]           # [O, cell]
        dark = striped[:, None] & ((image_rows // band) % 2 == 1)
        shade = np.where(dark, STRIPE_DARKNESS, 1.0).astype(np.float32)       # [O, cell]
        pixel = color[:, :, None, None] * shade[:, None, :, None]             # [O, 3, cell, 1]
        cells[bidx, row, col] = np.where(mask[:, None], pixel, np.float32(1.0))
    images = cells.transpose(0, 3, 1, 4, 2, 5).reshape(len(scenes), 3, size, size)
    return torch.from_numpy(np.ascontiguousarray(images))

"""The judge's second look at a shape: anti-aliased templates against the object's soft mask.

The judge's first fit (judge.WorldJudge._fit) compares binary pixel masks over a coarse grid
of centres and scales; it finds the neighbourhood of the right family fast, but a binary mask
of a small object off the pixel grid can look like its neighbour family (a 9-px cross painted
on a pixel corner thresholds to a blob), and IoU alone forgives a compact defect (a square
with a notch of 0.3 of its side keeps IoU 0.91). This module refines the best few families on
soft masks and checks what IoU hides:

- soft mask (the judge's WorldJudge._cover): each pixel's covered share, from its contrast
  over that of its palette colour at full cover (an edge pixel half covered reads 0.5, a
  stripe's dark band 1);
- template: each pixel's covered share of the shape, from SUB x SUB sub-pixel centres
  (render.inside; anti-aliased, as a generator or a painter draws) or from the pixel centre
  alone (hard-edged, as the world's renderer draws), whichever matches better, refined over a
  sub-pixel grid of centres and scales (REFINE);
- soft IoU = sum(min) / sum(max) of the two; the best family must beat the runner-up by a
  margin;
- defect: the largest mass missing from (or added to) the template within any 3 x 3 px
  window, in pixels: edge misalignment and noise spread thin along the outline (< ~1.5 px per
  window), a notch, hole, wedge, bite or bulge is compact;
- stretch: |log| of the ratio of the mask's and the template's x / y spread (second
  moments): an object stretched by 1.3 reads ~0.26, a world shape ~0.

fit_soft(...) -> SoftFit per candidate family; the judge applies the thresholds.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from margrpo.world.render import inside

SUB = 2   # sub-pixels per pixel side for template coverage (2: quarter-pixel resolution)
FINE_SUB = 6   # ... for the winning template, whose defect and stretch are measured
# Refinement grid around the first fit (moved onto the soft mask's centroid and mass):
# centre offsets (px) x scales of r.
REFINE = [(dx, dy, s) for dx, dy in ((0.0, 0.0), (0.25, 0.0), (-0.25, 0.0), (0.0, 0.25), (0.0, -0.25))
          for s in (0.96, 1.0, 1.04)]
PAD = 2   # px around the object's box in the compared window


@dataclass(frozen=True)
class SoftFit:
    family: int
    iou: float               # soft IoU of the best refined template
    defect: float            # largest missing or added mass in a 3 x 3 px window, px
    stretch: float           # |log| of (mask x / y spread) over (template x / y spread)
    params: tuple[float, float, float]   # (cx, cy, r) in px


def _window(mask: np.ndarray, size: int) -> tuple[slice, slice]:
    ys, xs = np.nonzero(mask)
    return (slice(max(ys.min() - PAD, 0), min(ys.max() + 1 + PAD, size)),
            slice(max(xs.min() - PAD, 0), min(xs.max() + 1 + PAD, size)))


def _coverage(family: int, grid: np.ndarray, ys: slice, xs: slice, sub: int = SUB) -> np.ndarray:
    """[G, h, w] covered share of each window pixel (sub x sub sub-pixel centres; sub = 1:
    the pixel centre alone, a hard edge) for G (cx, cy, r) rows of grid."""
    offs = (np.arange(sub) + 0.5) / sub
    py = (np.arange(ys.start, ys.stop)[:, None] + offs[None, :]).reshape(-1)     # [h * sub]
    px = (np.arange(xs.start, xs.stop)[:, None] + offs[None, :]).reshape(-1)     # [w * sub]
    cx, cy, r = (grid[:, i, None, None] for i in range(3))
    t = inside(family, px[None, None, :] - cx, py[None, :, None] - cy, r)        # [G, h sub, w sub]
    g, h, w = len(grid), ys.stop - ys.start, xs.stop - xs.start
    return t.reshape(g, h, sub, w, sub).sum((2, 4), dtype=np.float32) / np.float32(sub * sub)


def _centroid(a: np.ndarray) -> tuple[float, float]:
    """(y, x) centre of mass of a non-negative [h, w] array, px."""
    total = a.sum() + 1e-9
    y, x = np.indices(a.shape)
    return float((a * y).sum() / total), float((a * x).sum() / total)


def _spread(a: np.ndarray) -> tuple[float, float]:
    """(x, y) standard deviations of a non-negative [h, w] mass."""
    total = a.sum() + 1e-9
    my, mx = _centroid(a)
    y, x = np.indices(a.shape)
    return (float(np.sqrt((a * (x - mx) ** 2).sum() / total)), float(np.sqrt((a * (y - my) ** 2).sum() / total)))


def fit_soft(soft: np.ndarray, mask: np.ndarray, candidates: list[tuple[int, tuple[float, float, float]]],
             floor: float = 0.0) -> list[SoftFit]:
    """Refine each (family, (cx, cy, r)) candidate on the soft mask [H, W] (image-sized);
    mask: the object's binary mask, which sets the compared window; floor: the soft mask and
    every template are compared through the ramp clip((x - floor) / (1 - 2 floor), 0, 1),
    which reads noise-level cover as 0 and keeps an edge where cover crosses 0.5. Best first;
    defect and stretch are measured for the best only (NaN for the others)."""
    ys, xs = _window(mask, soft.shape[0])

    def ramp(a):
        return np.clip((a - floor) / (1.0 - 2 * floor), 0.0, 1.0) if floor > 0 else a

    m = ramp(soft[ys, xs].astype(np.float32))
    fits = []   # (iou, family, params, template)
    for family, (cx, cy, r) in candidates:
        # The binary fit's scale follows the half-contrast cut, which drops edge pixels less
        # than half covered; rescale so that the template's area is the soft mask's mass.
        # Likewise its centre (a striped object's dark rows pass the cut wider than its light
        # ones): move the template's centroid onto the soft mask's.
        t0 = _coverage(family, np.array([[cx, cy, r]]), ys, xs)[0]
        scaled = r * float(np.sqrt(m.sum() / max(t0.sum(), 1e-6)))
        (my, mx), (ty, tx) = _centroid(m), _centroid(t0)
        sx, sy = cx + mx - tx, cy + my - ty
        # Anti-aliased templates on the grid, and the binary fit itself drawn hard-edged (pixel
        # centres, as the world renders: exact for a world object): [G + 1, h, w]
        grid = np.array([(sx + dx, sy + dy, scaled * s) for dx, dy, s in REFINE] + [(cx, cy, r)], dtype=np.float64)
        t = ramp(np.concatenate([_coverage(family, grid[:-1], ys, xs), _coverage(family, grid[-1:], ys, xs, sub=1)]))
        iou = np.minimum(t, m).sum((1, 2)) / np.maximum(np.maximum(t, m).sum((1, 2)), 1e-9)
        k = int(iou.argmax())
        fits.append((float(iou[k]), family, tuple(float(v) for v in grid[k]), t[k]))
    fits.sort(key=lambda f: -f[0])
    out = []
    for i, (iou, family, params, best) in enumerate(fits):
        defect = stretch = float("nan")   # measured on the winner only
        if i == 0:
            # The winner's template again at a finer anti-aliasing (SUB is coarse for a
            # 4-px-wide rectangle's spread), or hard-edged, whichever matches better.
            fine = ramp(_coverage(family, np.array([params]), ys, xs, sub=FINE_SUB)[0])
            if np.minimum(fine, m).sum() / max(np.maximum(fine, m).sum(), 1e-9) >= iou:
                best = fine
            missing = ndimage.uniform_filter(np.clip(best - m, 0, None), 3, mode="constant") * 9
            added = ndimage.uniform_filter(np.clip(m - best, 0, None), 3, mode="constant") * 9
            defect = float(max(missing.max(), added.max()))
            (mx, my), (tx, ty) = _spread(m), _spread(best)
            eps = 1e-6   # a one-pixel-wide sliver has no x spread: an infinite stretch, never a shape
            stretch = float(abs(np.log(max(mx, eps) / max(my, eps)) - np.log(max(tx, eps) / max(ty, eps))))
        out.append(SoftFit(family, iou, defect, stretch, params))
    return out

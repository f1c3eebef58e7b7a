"""The evaluation judge: what a careful person would see in a world image, as Detections.

Evaluation (the test split, in-training held-out scores, the report) reads the judge; the
training reward reads the cheap detector in detect.py and never this module, so an image
that fools the reward does not also fool the numbers that decide the study. The judge uses
what the synthetic world makes exact: the family of every shape (render.inside) and the
palette.

For images [B, 3, H, W] in [0, 1]:
1. Objects: pixels whose contrast from white, lightly smoothed, exceeds `fg` (far below any
   palette colour, so a 30%-contrast object is found), 8-connected per image; a component
   whose brightest pixels stay below `min_peak` or smaller than `min_area` px is noise. An
   object's mask is its pixels above half of its own light-band contrast, so faint and
   full-contrast objects are cut at the same place, their true edge.
2. Shape: every family is fitted to the mask over a sub-pixel grid of centres and scales
   (started from the mask's box, which for every world shape is the shape's box; an object
   cut by the image edge is started from its uncut side and fitted against the visible part
   only), scored by intersection over union of pixel masks. The best few families are then
   refined on the object's soft cover (world/shapefit.py); the best names the object when
   its soft IoU is at least `fit_iou`, it beats the runner-up by `margin`, no compact piece
   is missing or added (`max_defect`) and it is not stretched (`max_stretch`); otherwise the
   object is "other": it exists (it can break a count or an exclusion) but is none of the
   world's shapes.
3. Touching objects: a component no family names is split by colour, then at its narrowest
   point (erosion), and kept split when every part is named.
4. Colour: the light interior pixels vote for the palette colour whose direction of
   (1 - rgb) lies within 15 degrees of their own, the dark ones back the winner c when they
   lie within its stripe shade's window; the object has colour c only when c's backing is at
   least `color_share` of its pixels (a 60 / 40 two-colour object is "mixed") and the mean colour of its light pixels keeps c's CIELAB hue angle (within
   6-22 degrees, set from CIELAB distances, world/perceptual.py) and most of its chroma;
   colours off the palette are "other". Texture: striped when the rows alternate
   between the colour and its dark shade at least twice. Size: the fitted box against the
   boundary between the world's small and large boxes.
Every detection has score 1.0: the judge decides, it does not hedge.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy import ndimage

from margrpo.eval.detections import Detection
from margrpo.world.grammar import SHAPES
from margrpo.world.render import COLOR_NAMES, COLOR_TABLE, SIZE_FRACTION, STRIPE_DARKNESS, check_size, inside
from margrpo.world.perceptual import drift_hue, hue_difference, lch
from margrpo.world.shapefit import SoftFit, fit_soft

OTHER = "other"
_STRUCT = np.zeros((3, 3, 3), dtype=bool)
_STRUCT[1] = True                       # 8-connected within an image, never across the batch
# Unit directions of (1 - rgb): the palette colours, then their dark stripe shades. [2C, 3]
_DIRS = np.concatenate([1.0 - COLOR_TABLE, 1.0 - STRIPE_DARKNESS * COLOR_TABLE]).astype(np.float64)
_DIRS /= np.linalg.norm(_DIRS, axis=1, keepdims=True)
_COS_MATCH = math.cos(math.radians(15))  # palette directions are >= 25 degrees apart
# Each colour's CIELAB hue window (degrees): how far its hue angle turns when the colour
# drifts 0.275 of the perceptual (delta E) way to its nearest world colour, midway between
# the drift a person still names the colour (0.15) and one a person names otherwise (0.4):
# 6.0 (red, towards orange) to 21.6 (cyan, towards blue). A colour keeps its name down to
# MIN_CHROMA of its chroma (15% grey keeps 0.86-0.93 of it, 60% grey 0.42-0.57).
_PALETTE_LCH = lch(COLOR_TABLE.astype(np.float64))
_HUE_WINDOW = np.array([drift_hue(c, 0.275) for c in COLOR_NAMES])
MIN_CHROMA = 0.72
# Contrast (as dev: |1 - rgb| / sqrt(3)) of each palette colour and dark shade at full cover. [2C]
_FULL = np.linalg.norm(np.concatenate([1.0 - COLOR_TABLE, 1.0 - STRIPE_DARKNESS * COLOR_TABLE]), axis=1) / math.sqrt(3)
# Fit grids, coarse then fine: centre offsets (px) x scale factors of the half-side r. A pixel
# mask's IoU is a rough function of sub-pixel parameters, so the coarse grid is dense (a
# sparse coarse-to-fine search stalls: measured on off-grid renders).
_GRIDS = [[(dx, dy, 1 + ds) for dx in (-0.5, 0, 0.5) for dy in (-0.5, 0, 0.5) for ds in (-0.1, -0.05, 0, 0.05)],
          [(dx, dy, 1 + ds) for dx in (-0.25, 0, 0.25) for dy in (-0.25, 0, 0.25) for ds in (-0.025, 0, 0.025)]]
# Cover below this share reads as 0, above 1 - it as 1, in the object and its templates alike
# (shapefit.fit_soft): sampling noise reads as ~0.1 of cover on the white around an object.
NOISE_FLOOR = 0.15
# Families refined on the soft mask after the binary fit: the best CANDIDATES by binary IoU,
# past the second only those within CLOSE of the best.
CANDIDATES, CLOSE = 3, 0.12
# Side (px) of the window an object is fitted on: a large world object (13 px at 32 px) with
# blur, the grids' reach and a 10% larger scale fits in it; a bigger blob fits no family.
WINDOW = 20


def _palette_match(v: np.ndarray) -> np.ndarray:
    """v: [P, 3] ink (1 - rgb) -> [P] index into _DIRS (the C palette colours, then their
    dark shades) of each pixel's nearest direction, -1 where none lies within 15 degrees."""
    cos = (v / (np.linalg.norm(v, axis=1, keepdims=True) + 1e-9)) @ _DIRS.T   # [P, 2C]
    k = cos.argmax(1)
    return np.where(cos[np.arange(len(k)), k] >= _COS_MATCH, k, -1)


def _quantile(values: np.ndarray, q: float) -> float:
    """The q-quantile of a few hundred values, nearest rank (np.percentile's overhead is ~10x
    the work at this size)."""
    return float(np.partition(values, int(q * (len(values) - 1)))[int(q * (len(values) - 1))])


class WorldJudge:
    """Callable: images [B, 3, H, W] -> one list of Detections per image (label a world shape
    or "other"; attributes color / texture / size)."""

    def __init__(self, image_size: int = 32, fg: float = 0.07, min_peak: float = 0.1,
                 min_area: int = 6, coarse_iou: float = 0.6, fit_iou: float = 0.875, margin: float = 0.03,
                 max_defect: float = 4.8, max_stretch: float = 0.10, color_share: float = 0.75):
        self.size = check_size(image_size)
        self.cell = image_size / 2
        self.fg, self.min_peak, self.min_area = fg, min_peak, min_area
        self.coarse_iou, self.fit_iou, self.margin = coarse_iou, fit_iou, margin
        self.max_defect, self.max_stretch, self.color_share = max_defect, max_stretch, color_share
        self.size_boundary = 0.5 * (SIZE_FRACTION["small"] + SIZE_FRACTION["large"])

    def __call__(self, images: torch.Tensor) -> list[list[Detection]]:
        x = images.detach().float().cpu().clamp(0, 1).numpy().astype(np.float64)
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2:] != (self.size, self.size):
            raise ValueError(f"expected images [B, 3, {self.size}, {self.size}], got {tuple(x.shape)}")
        ink = 1.0 - x                                                   # [B, 3, H, W]
        smooth = ndimage.gaussian_filter(ink, sigma=(0, 0, 0.5, 0.5), mode="nearest")
        dev_s = np.sqrt((smooth ** 2).mean(1))                          # [B, H, W] contrast, smoothed
        dev = np.sqrt((ink ** 2).mean(1))                               # [B, H, W] contrast
        blobs = self._blobs(dev_s, dev)
        fits = self._fit([m for _, m, _ in blobs])
        out: list[list[Detection]] = [[] for _ in range(x.shape[0])]
        for (b, mask, level), fit in zip(blobs, fits):
            parts = [(mask, self._verify(mask, fit, ink[b], dev[b], level))]
            if parts[0][1] is None:
                parts = self._split(mask, ink[b], dev[b], level) or parts
            for m, f in parts:
                out[b].append(self._describe(m, f, ink[b], dev[b], level))
        return out

    # ------------------------------------------------------------------ objects

    def _blobs(self, dev_s: np.ndarray, dev: np.ndarray) -> list[tuple[int, np.ndarray, float]]:
        """(image index, full-image bool mask [H, W], light-band contrast) of every object
        candidate. Objects are
        found on the smoothed contrast dev_s (noise neither cuts nor speckles them) and cut
        out on the raw contrast dev (smoothing would round a square's corners off)."""
        labels, _ = ndimage.label(dev_s > self.fg, structure=_STRUCT)
        out = []
        for lab, sl in enumerate(ndimage.find_objects(labels), start=1):
            if sl is None:
                continue
            b = sl[0].start
            comp = labels[b] == lab
            vals = dev_s[b][comp]
            peak = _quantile(vals, 0.9)
            if peak < self.min_peak:
                continue
            # Light-band level: the lower part of the interior (stripes' dark bands are darker).
            level = _quantile(vals[vals >= 0.5 * peak], 0.3)
            mask = comp & (dev[b] >= 0.5 * level)
            sub, n = ndimage.label(mask, structure=_STRUCT[1])
            for k in range(1, n + 1):
                part = sub == k
                if part.sum() >= self.min_area:
                    out.append((b, part, float(level)))
        return out

    # ------------------------------------------------------------------ shape fit

    def _fit(self, masks: list[np.ndarray]) -> list[list[tuple[int, float, tuple]]]:
        """Per mask: (family index, binary IoU, (cx, cy, r) in px) of every family, best first."""
        if not masks:
            return []
        inits = [self._init(m) for m in masks]
        best = None   # [O, S] IoU and params after each grid
        for grid in _GRIDS:
            centre = inits if best is None else [[p for p in best[1][o]] for o in range(len(masks))]
            ious, params = self._grid_iou(masks, centre, grid)
            best = (ious, params)
        ious, params = best
        return [[(int(s), float(ious[o, s]), params[o][s]) for s in np.argsort(-ious[o])] for o in range(len(masks))]

    def _cover(self, ink, dev, mask, support, level) -> np.ndarray:
        """[H, W] covered share of each support pixel: its contrast over the full contrast of
        the palette colour or shade its hue matches (the object's level off the palette), over
        the object's own opacity (the 90th percentile of that ratio on its mask: 1 for a
        world object, 0.3 for a faint one); 0 off the support."""
        ys, xs = np.nonzero(support)
        k = _palette_match(ink[:, ys, xs].T)
        full = np.where(k >= 0, _FULL[k], level)
        ratio = np.zeros(dev.shape)
        ratio[ys, xs] = dev[ys, xs] / np.maximum(full, 1e-6)
        return np.clip(ratio / max(_quantile(ratio[mask], 0.9), 1e-6), 0.0, 1.0)

    def _verify(self, mask, fit, ink, dev, level, exclude=None) -> SoftFit | None:
        """The soft fit that names the object, or None ("other"): the best binary candidates
        refined on the soft mask (world/shapefit.py); the winner needs soft IoU >= fit_iou,
        a lead of margin over the runner-up, no compact defect and no stretch."""
        if fit[0][1] < self.coarse_iou:
            return None
        support = ndimage.binary_dilation(mask)
        if exclude is not None:
            support &= ~exclude
        cover = self._cover(ink, dev, mask, support, level)
        # The runner-up always (the lead is measured against it), a third family only when its
        # binary IoU is close to the best's (a small anti-aliased cross can rank third).
        near = [(s, p) for i, (s, iou, p) in enumerate(fit[:CANDIDATES]) if i < 2 or iou >= fit[0][1] - CLOSE]
        refined = fit_soft(cover, mask, near, floor=NOISE_FLOOR)
        best, runner_up = refined[0], refined[1]
        if (best.iou >= self.fit_iou and best.iou - runner_up.iou >= self.margin
                and best.defect <= self.max_defect and best.stretch <= self.max_stretch):
            return best
        return None

    def _init(self, mask: np.ndarray) -> list[tuple[float, float, float]]:
        """Start (cx, cy, r) per family from the mask's box: every world shape's box is
        [c - r, c + r]^2. An object cut by the image edge keeps its uncut side."""
        ys, xs = np.nonzero(mask)
        y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        h, w = y1 - y0, x1 - x0
        r = max(h, w) / 2
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        n = self.size
        if w < h - 1:
            cx = x1 - r if x0 == 0 else x0 + r if x1 == n else cx
        if h < w - 1:
            cy = y1 - r if y0 == 0 else y0 + r if y1 == n else cy
        return [(cx, cy, r)] * len(SHAPES)

    def _grid_iou(self, masks, centres, grid) -> tuple[np.ndarray, list[list[tuple]]]:
        """IoU [O, S] of the best grid point around each (object, family) start, and its params.

        Each object is compared on a window of WINDOW px around its start; pixels of the
        window outside the image count for neither mask, so a cut object is fitted against
        what is visible."""
        n, g, w = self.size, np.asarray(grid, dtype=np.float32), WINDOW
        o_n = len(masks)
        start = np.array(centres, dtype=np.float32)                    # [O, S, 3]
        origin = np.round(start[:, 0, :2]).astype(int) - w // 2        # [O, 2] window (x, y) origin
        padded = np.pad(np.stack(masks), ((0, 0), (w, w), (w, w)))      # [O, H + 2w, W + 2w]
        valid = np.pad(np.ones((n, n), dtype=bool), w)
        rows = origin[:, 1, None] + w + np.arange(w)                    # [O, w] padded indices
        cols = origin[:, 0, None] + w + np.arange(w)
        m = padded[np.arange(o_n)[:, None, None], rows[:, :, None], cols[:, None, :]]   # [O, w, w]
        ok = valid[rows[:, :, None], cols[:, None, :]]
        area = m.sum((1, 2))
        px = (origin[:, 0, None] + np.arange(w) + 0.5).astype(np.float32)   # [O, w] pixel centres, px
        py = (origin[:, 1, None] + np.arange(w) + 0.5).astype(np.float32)
        ious = np.zeros((o_n, len(SHAPES)))
        params: list[list[tuple]] = [[None] * len(SHAPES) for _ in masks]
        for s in range(len(SHAPES)):
            cx = start[:, s, None, 0] + g[None, :, 0]                  # [O, G]
            cy = start[:, s, None, 1] + g[None, :, 1]
            r = start[:, s, None, 2] * g[None, :, 2]
            t = inside(s, px[:, None, None, :] - cx[..., None, None],
                       py[:, None, :, None] - cy[..., None, None], r[..., None, None])    # [O, G, w, w]
            t &= ok[:, None]
            inter = (t & m[:, None]).sum((2, 3))
            union = t.sum((2, 3)) + area[:, None] - inter
            iou = inter / np.maximum(union, 1)
            k = iou.argmax(1)
            ious[:, s] = iou[np.arange(o_n), k]
            for o in range(o_n):
                params[o][s] = (float(cx[o, k[o]]), float(cy[o, k[o]]), float(r[o, k[o]]))
        return ious, params

    # ------------------------------------------------------------------ touching objects

    def _split(self, mask, ink, dev, level) -> list[tuple[np.ndarray, SoftFit]] | None:
        """Parts of a component no family fits, each fitting one, or None."""
        for parts in (self._colour_parts(mask, ink), self._neck_parts(mask)):
            parts = [p for p in parts if p.sum() >= self.min_area]
            if len(parts) >= 2:
                verified = [self._verify(p, f, ink, dev, level, exclude=mask & ~p)
                            for p, f in zip(parts, self._fit(parts))]
                if all(v is not None for v in verified):
                    return list(zip(parts, verified))
        return None

    def _colour_parts(self, mask, ink) -> list[np.ndarray]:
        colour = np.full(mask.shape, -1)
        ys, xs = np.nonzero(mask)
        colour[ys, xs] = self._pixel_colours(ink[:, ys, xs].T)[0]
        parts = []
        for c in set(colour[ys, xs].tolist()) - {-1}:
            lab, k = ndimage.label(colour == c, structure=_STRUCT[1])
            parts += [lab == i for i in range(1, k + 1)]
        return parts

    def _neck_parts(self, mask) -> list[np.ndarray]:
        """Erode until the mask falls apart, then give every pixel to the nearest core."""
        core = mask
        for _ in range(3):
            core = ndimage.binary_erosion(core)
            lab, k = ndimage.label(core, structure=_STRUCT[1])
            if k >= 2:
                _, (iy, ix) = ndimage.distance_transform_edt(lab == 0, return_indices=True)
                owner = lab[iy, ix]
                return [mask & (owner == i) for i in range(1, k + 1)]
            if k == 0:
                break
        return []

    # ------------------------------------------------------------------ attributes

    def _pixel_colours(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """v: [P, 3] ink (1 - rgb) -> (colour index per pixel or -1 off the palette, dark shade?)."""
        k = _palette_match(v)
        nc = len(COLOR_NAMES)
        return np.where(k >= 0, k % nc, -1), k >= nc

    def _describe(self, mask, fit: SoftFit | None, ink, dev, level) -> Detection:
        ys, xs = np.nonzero(mask)
        box = (float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1))
        extent = 2 * fit.params[2] if fit is not None else max(box[2] - box[0], box[3] - box[1])
        # Interior pixels only: edge pixels mix with white (same direction) and with neighbours.
        vals = dev[ys, xs]
        interior = vals >= 0.6 * _quantile(vals, 0.9)
        v = ink[:, ys[interior], xs[interior]].T
        colour, dark = self._pixel_colours(v)
        return Detection(
            label=SHAPES[fit.family] if fit is not None else OTHER, score=1.0, box=box,
            attributes={"color": self._colour_name(colour, dark, v),
                        "texture": self._texture(ys[interior], dark),
                        "size": "large" if extent / self.cell >= self.size_boundary else "small"})

    def _colour_name(self, colour: np.ndarray, dark: np.ndarray, v: np.ndarray) -> str:
        """colour, dark: per interior pixel (_pixel_colours); v: their ink [P, 3]."""
        n = len(colour)
        if n == 0:
            return OTHER
        # The colour is the light pixels' vote; a dark pixel supports it when it lies within
        # the window of c's own dark shade (the dark shades of neighbouring colours are a few
        # degrees apart, so their argmax splits under noise).
        light_votes = np.bincount(colour[(colour >= 0) & ~dark], minlength=len(COLOR_NAMES))
        c = int(light_votes.argmax())
        lit = (colour == c) & ~dark
        light = int(lit.sum())
        shade = _DIRS[len(COLOR_NAMES) + c]
        dark_ok = dark & ((v @ shade) >= _COS_MATCH * np.linalg.norm(v, axis=1))
        if light + int(dark_ok.sum()) >= self.color_share * n and light >= 0.25 * n:
            # The votes' 15-degree window admits hues a person names otherwise: the light
            # pixels' mean colour, un-mixed from the white background by its opacity (its
            # ink's projection on c's), must keep c's hue (_HUE_WINDOW) and most of its chroma.
            ink_c = 1.0 - COLOR_TABLE[c].astype(np.float64)
            mean = v[lit].mean(0)
            opacity = float(np.clip(mean @ ink_c / (ink_c @ ink_c), 0.05, 1.0))
            _, chroma, hue = lch(np.clip(1.0 - mean / opacity, 0.0, 1.0))
            if (abs(hue_difference(hue, _PALETTE_LCH[2][c])) <= _HUE_WINDOW[c]
                    and chroma >= MIN_CHROMA * _PALETTE_LCH[1][c]):
                return COLOR_NAMES[c]
            return OTHER
        # A grey or black object matches only dark shades; a two-colour object splits votes.
        return "mixed" if light >= 0.25 * n else OTHER

    @staticmethod
    def _texture(rows: np.ndarray, dark: np.ndarray) -> str:
        if rows.size == 0:
            return "solid"
        r = rows - rows.min()
        count = np.bincount(r)
        dark_rows = np.bincount(r, weights=dark.astype(np.float64)) / np.maximum(count, 1)
        kept = dark_rows[count >= 2] > 0.5
        runs = np.count_nonzero(np.diff(kept.astype(np.int8))) + 1 if kept.size else 0
        dark_runs = (runs + int(kept[0])) // 2 if kept.size else 0
        return "striped" if dark_runs >= 2 and runs - dark_runs >= 2 else "solid"


class JudgedEvaluator:
    """The study's evaluation: GenEval / T2I-CompBench rules over the judge's detections, and
    the same rules over the training reward's detector on the same images (keys prefixed
    proxy_), so the report can show where the reward and the judge part ways.

    score(images [B, 3, H, W], metadata) -> the judge's per-image tensors (geneval, t2i,
    partial, correct, ...), proxy_geneval / proxy_t2i / proxy_correct, and the judge's
    detections and reasons."""

    def __init__(self, image_size: int = 32):
        from margrpo.world.evaluator import WorldEvaluator

        self.judge = WorldEvaluator(image_size, detector=WorldJudge(image_size))
        self.proxy = WorldEvaluator(image_size)

    def score(self, images: torch.Tensor, metadata: list[dict]) -> dict:
        out = self.judge.score(images, metadata)
        proxy = self.proxy.score(images, metadata)
        out.update({f"proxy_{k}": proxy[k] for k in ("geneval", "t2i", "correct")})
        return out

    def batch_metrics(self, images: torch.Tensor, metadata: list[dict]) -> dict[str, torch.Tensor]:
        """Per-image judge/correct and judge/proxy_correct [B] (GenEval's rules on every
        prompt, by the judge and by the reward's detector): the trainer's monitor."""
        s = self.score(images, metadata)
        return {"judge/correct": s["correct"], "judge/proxy_correct": s["proxy_correct"]}

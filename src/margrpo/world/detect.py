"""Pixel-only object detector for the embedded world (never reads render metadata).

Pipeline for images [B, 3, H, W] in [0, 1]:
1. Foreground: the colour channels Gaussian-smoothed (sigma 0.45 px at 32 px, so that
   sampling noise of a generative model does not cut or speckle the mask), then the
   distance from white ||1 - rgb|| / sqrt(3) per pixel (every palette colour is >= 0.52
   away, the background 0), thresholded at 0.25 (half the weakest colour's contrast).
2. Objects: 8-connected components of the mask, per image; components smaller than a
   quarter of a small triangle are noise and dropped.
3. Per component: box; shape by the intersection over union of the mask (at 0.45 of the
   object's own contrast) with every world shape drawn in the same box (render.inside; no
   search over positions or scales: that is the evaluation judge's work), turned into
   probabilities by a softmax of IoU / SHAPE_TEMPERATURE; colour by votes of pixels whose direction 1 - rgb matches
   a palette colour or its dark stripe shade (the direction is invariant to mixing with
   the white background, so blurred edge pixels vote correctly); texture by the
   row-wise alternation of dark-shade votes; size by the box extent relative to a cell.
4. score = shape probability x a plausibility factor (square-ish box, extent that fits
   a cell), so merged blobs and specks get low confidence.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from margrpo.eval.detections import Detection
from margrpo.world.grammar import SHAPES
from margrpo.world.render import BOX_WIDTH, COLOR_NAMES, COLOR_TABLE, SIZE_FRACTION, STRIPE_DARKNESS, check_size, inside

# Directions of (1 - rgb) for the C palette colours, then their dark stripe shades: [2C, 3].
_PROTO = np.concatenate([1.0 - COLOR_TABLE, 1.0 - STRIPE_DARKNESS * COLOR_TABLE], 0)
_PROTO /= np.linalg.norm(_PROTO, axis=1, keepdims=True)
# IoU units per logit unit: a clean world shape fits its own family at IoU ~1 and the
# nearest other at <= 0.8, so it gets probability > 0.99; a blob halfway between two
# families gets ~0.5 each.
SHAPE_TEMPERATURE = 0.02
# One image = one slice: connect 8-neighbours within an image, never across the batch.
_STRUCTURE = np.zeros((3, 3, 3), dtype=bool)
_STRUCTURE[1] = True


class WorldDetector:
    """Callable: images [B, 3, H, W] -> one list of Detections per image, sorted by score."""

    def __init__(self, image_size: int = 32, fg_threshold: float = 0.25,
                 smooth_sigma: float | None = None, shape_level: float = 0.45,
                 stripe_energy: float = 0.35):
        self.size = check_size(image_size)
        self.cell = image_size / 2
        self.fg_threshold = fg_threshold
        self.sigma = 0.45 * image_size / 32 if smooth_sigma is None else smooth_sigma
        self.shape_level = shape_level
        self.stripe_energy = stripe_energy
        small = SIZE_FRACTION["small"] * self.cell
        self.min_area = 0.25 * small * small / 2
        # Size boundary halfway between the small and large box extents, in cells.
        self.size_boundary = 0.5 * (SIZE_FRACTION["small"] + SIZE_FRACTION["large"])

    def __call__(self, images: torch.Tensor) -> list[list[Detection]]:
        x = images.detach().float().cpu().clamp(0, 1).numpy()    # [B, 3, H, W]
        if x.ndim != 4 or x.shape[1] != 3 or x.shape[2:] != (self.size, self.size):
            raise ValueError(f"expected images [B, 3, {self.size}, {self.size}], got {tuple(x.shape)}")
        # Smooth the colour channels (not the distance: a norm of noise is biased upwards),
        # then measure the distance from white.
        x_s = ndimage.gaussian_filter(x, sigma=(0, 0, self.sigma, self.sigma), mode="nearest")
        dev = np.sqrt(((1.0 - x_s) ** 2).mean(1))                 # [B, H, W]
        raw = np.sqrt(((1.0 - x) ** 2).mean(1))                   # [B, H, W] unsmoothed
        labels, _ = ndimage.label(dev > self.fg_threshold, structure=_STRUCTURE)
        out: list[list[Detection]] = [[] for _ in range(x.shape[0])]
        for lab, sl in enumerate(ndimage.find_objects(labels), start=1):
            if sl is None:
                continue
            b = sl[0].start
            # Crop with a 1-px margin: the contrast-relative mask below may grow past the
            # fixed-threshold component by a pixel.
            ys = slice(max(sl[1].start - 1, 0), min(sl[1].stop + 1, self.size))
            xs = slice(max(sl[2].start - 1, 0), min(sl[2].stop + 1, self.size))
            comp = labels[b, ys, xs] == lab
            if comp.sum() < self.min_area:
                continue
            det = self._describe(comp, dev[b, ys, xs], raw[b, ys, xs], 1.0 - x[b][:, ys, xs], ys.start, xs.start)
            if det is not None:
                out[b].append(det)
        for dets in out:
            dets.sort(key=lambda d: -d.score)
        return out

    def _describe(self, comp, dev, raw, dev_vec, y0: int, x0: int) -> Detection | None:
        """comp: [h, w] component mask in a crop; dev / raw: [h, w] smoothed / raw distance from white;
        dev_vec: [3, h, w] raw 1 - rgb; (y0, x0): crop origin in the image."""
        # Shape mask at a fraction of the object's own contrast: blur rounds the corners of
        # a square at the half-contrast level but not at a low one (a corner keeps 1/4 of
        # the contrast), and a low relative level treats pale and dark colours alike.
        # The level comes from the smoothed contrast (noise-free), the cut from the raw one (a
        # small ring's 3-px hole survives it, not the smoothing).
        level = np.percentile(dev[comp], 90)
        m = ndimage.binary_dilation(comp) & (raw > self.shape_level * level)
        ys, xs = np.nonzero(m)
        if ys.size < self.min_area:
            return None
        by0, by1, bx0, bx1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
        h, w = by1 - by0, bx1 - bx0
        logits = _box_ious(m[by0:by1, bx0:bx1]) / SHAPE_TEMPERATURE
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        k = int(probs.argmax())

        extent = max(h, w) / self.cell
        aspect = abs(np.log(w / (BOX_WIDTH[k] * h)))   # against the fitted family's own box
        # Noise can shave a row or column off a 9-px object, so aspect ratios up to 1.35
        # cost nothing; longer boxes are smears or merged objects.
        plausible = np.exp(-0.5 * (max(aspect - 0.3, 0.0) / 0.15) ** 2)
        if extent > 1.0:   # wider than a cell: two merged objects, or a smear
            plausible *= np.exp(-((extent - 1.0) / 0.1) ** 2)
        score = float(probs[k] * plausible)

        cy, cx = np.nonzero(comp)
        color, color_p, texture, texture_p = self._color_texture(dev_vec[:, cy, cx].T, cy)
        size_p_large = 1.0 / (1.0 + np.exp(-(extent - self.size_boundary) / 0.02))
        size = "large" if size_p_large >= 0.5 else "small"
        return Detection(
            label=SHAPES[k], score=score,
            box=(float(x0 + bx0), float(y0 + by0), float(x0 + bx1), float(y0 + by1)),
            attributes={"color": color, "texture": texture, "size": size},
            attribute_scores={"color": color_p, "texture": texture_p,
                              "size": float(max(size_p_large, 1 - size_p_large))},
        )

    def _color_texture(self, v: np.ndarray, ys: np.ndarray) -> tuple[str, float, str, float]:
        """v: [P, 3] raw 1 - rgb of the component's pixels; ys: [P] their rows."""
        norm = np.linalg.norm(v, axis=1) + 1e-6
        cos = (v / norm[:, None]) @ _PROTO.T                      # [P, 10]
        proto = cos.argmax(1)
        nc = len(COLOR_NAMES)
        colour_idx, dark = proto % nc, proto >= nc
        # Dark shades of different colours point in close directions (all near grey),
        # so they vote with half weight; far-from-white pixels weigh more than fringes.
        weight = norm * np.where(dark, 0.5, 1.0)
        votes = np.bincount(colour_idx, weights=weight, minlength=nc)
        c = int(votes.argmax())
        color_p = float(votes[c] / votes.sum())

        # Row-wise alternation energy of dark votes: 0 for solid (or uniformly dark)
        # objects, ~1 for bands of alternating shade.
        rows = ys - ys.min()
        n_row = np.bincount(rows)
        dark_row = np.bincount(rows, weights=dark.astype(np.float64))
        keep = n_row >= 2
        frac = dark_row[keep] / n_row[keep]
        energy = float(2 * np.abs(frac - frac.mean()).mean()) if frac.size >= 3 else 0.0
        p_striped = 1.0 / (1.0 + np.exp(-(energy - self.stripe_energy) / 0.05))
        texture = "striped" if p_striped >= 0.5 else "solid"
        return COLOR_NAMES[c], color_p, texture, float(max(p_striped, 1 - p_striped))


def _box_ious(m: np.ndarray) -> np.ndarray:
    """IoU [S] of a boxed mask [h, w] with every world shape whose box is the mask's box
    (height 2r = h, centred; a shape narrower than tall keeps its own width), the better of
    two scales."""
    h, w = m.shape
    r = h / 2
    side = max(h, w)   # a square window, so that every family fits inside it
    m = np.pad(m, (((side - h) // 2, side - h - (side - h) // 2), ((side - w) // 2, side - w - (side - w) // 2)))
    dy = (np.arange(side) + 0.5 - (side - h) // 2 - h / 2)[:, None]
    dx = (np.arange(side) + 0.5 - (side - w) // 2 - w / 2)[None, :]
    out = np.zeros(len(SHAPES))
    for s in range(len(SHAPES)):
        # A shape d px across covers round(d) pixels, so the box's half-side h / 2 is up to
        # 0.5 px too large; two scales keep a small ring's hole from flipping pixels.
        for scale in (0.95, 1.0):
            t = inside(s, dx, dy, scale * r)
            out[s] = max(out[s], (t & m).sum() / max(int((t | m).sum()), 1))
    return out

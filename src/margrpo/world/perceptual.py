"""Colour as a person sees it: CIELAB (D65 white) and the CIE 1976 colour difference.

The near-miss families' truth rule (families.py) measures how far a hue has drifted in this
space; the judge (judge.py) names an object's colour by its CIELAB hue angle and chroma
(LCh), which keep a desaturated colour's name where a hue drift of the same delta E loses it.
"""
from __future__ import annotations

import numpy as np

from margrpo.world.grammar import COLORS


def lab(rgb) -> np.ndarray:
    """sRGB in [0, 1] (..., 3) -> CIELAB (..., 3), D65 white."""
    c = np.asarray(rgb, dtype=np.float64)
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def delta_e(a, b) -> float:
    """CIE 1976 colour difference between two sRGB colours."""
    return float(np.linalg.norm(lab(a) - lab(b)))


def nearest_other(name: str) -> str:
    """The world colour perceptually nearest to `name`: the hue a drift goes towards."""
    others = [c for c in COLORS if c != name]
    return min(others, key=lambda c: delta_e(COLORS[name], COLORS[c]))


def lch(rgb) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sRGB (..., 3) -> (lightness, chroma, hue angle in degrees) of CIELAB."""
    L, a, b = np.moveaxis(lab(rgb), -1, 0)
    return L, np.hypot(a, b), np.degrees(np.arctan2(b, a))


def hue_difference(h1, h2):
    """Signed smallest difference of two hue angles, degrees in [-180, 180)."""
    return (np.asarray(h1) - np.asarray(h2) + 180.0) % 360.0 - 180.0


def drift_hue(name: str, share: float) -> float:
    """Degrees of CIELAB hue angle between colour `name` and its mixture with its nearest
    other colour that has drifted `share` of the perceptual (delta E) way there."""
    base, other = np.asarray(COLORS[name], float), np.asarray(COLORS[nearest_other(name)], float)
    total = delta_e(base, other)
    lo, hi = 0.0, 1.0
    for _ in range(40):   # bisection on the mixing weight: delta E grows with it
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if delta_e(base, (1 - mid) * base + mid * other) < share * total else (lo, mid)
    return float(abs(hue_difference(lch((1 - lo) * base + lo * other)[2], lch(base)[2])))

"""The unit every benchmark rule reads: one detected object in one image.

The embedded world's pixel detector and the real detectors of the benchmark protocols
(GroundingDINO / OWL-ViT, CLIP colour classification) all produce `Detection`s, so the
GenEval and T2I-CompBench rules in this package are written once and serve both.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Detection:
    """One object found in one image.

    label: class name ("circle", or a COCO class for real GenEval).
    score: detector confidence in [0, 1].
    box: (x0, y0, x1, y1) in pixels, x to the right, y down; x1/y1 exclusive.
    attributes: attribute name -> value, e.g. {"color": "red", "texture": "striped",
        "size": "large"}; absent when the detector cannot tell.
    attribute_scores: attribute name -> confidence in [0, 1] of that value (soft scores
        for T2I-CompBench-style metrics); a missing entry means 1.0.
    """

    label: str
    score: float
    box: tuple[float, float, float, float]
    attributes: dict[str, str] = field(default_factory=dict)
    attribute_scores: dict[str, float] = field(default_factory=dict)

    @property
    def center(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return (0.5 * (x0 + x1), 0.5 * (y0 + y1))

    @property
    def size(self) -> tuple[float, float]:
        x0, y0, x1, y1 = self.box
        return (x1 - x0, y1 - y0)

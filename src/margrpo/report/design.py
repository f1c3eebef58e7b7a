"""The study's design (study_design.yaml): each claim's parts, margins, smallest effects of
interest and the pilot's variance components, parsed once into frozen objects, and the power
and seeds that follow from them (report/inference.py).

The seeds a claim needs come from the pilot's variance and the effect written down before
the run, never from the difference a run measured (that would be post hoc power).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from margrpo.report import inference as inf

DESIGN_FILE = "study_design.yaml"
DESIGNS = ("one-sample", "paired")
VERSUS = ("base", "trained")


@dataclass(frozen=True)
class Components:
    """Variance components of one seed's score (score units): training noise, evaluation noise
    at the pilot's allocation, and the correlation of two arms' evaluation noise at a seed."""
    sigma_t: float
    sigma_e: float
    rho_e: float = 0.0


@dataclass(frozen=True)
class PartDesign:
    key: str
    delta: float   # |d| < delta is negligible: the band of "no difference" and of "does not hold"
    effect: float  # the smallest effect of interest, which the seeds are sized to detect
    sd: float      # the pilot's sd of one seed's value of the part (a difference where paired)
    design: str    # 'one-sample' or 'paired' (report/inference.py)
    metric: str | None = None  # score parts: the metric their sd comes from
    versus: str | None = None  # score parts: 'base' or 'trained', the arm compared against

    def power(self, n) -> float:
        return inf.power(self.effect, self.sd, n, design=self.design)


@dataclass(frozen=True)
class ClaimDesign:
    number: int
    text: str
    parts: dict[str, PartDesign]
    best: bool = False

    def power(self, n) -> float:
        """Probability that the claim holds at n seeds when every part's effect is its
        smallest effect of interest (inference.claim_power)."""
        return float(inf.claim_power([(p.effect, p.sd, p.design) for p in self.parts.values()], n))

    def seeds(self, target: float) -> int | None:
        return inf.seeds_for_claim([(p.effect, p.sd, p.design) for p in self.parts.values()], target)


@dataclass(frozen=True)
class Design:
    alpha: float
    power: float
    eval_scale: float
    pilot: dict[str, Components]
    claims: dict[int, ClaimDesign]

    def part(self, claim: int, key: str) -> PartDesign | None:
        c = self.claims.get(claim)
        return c.parts.get(key) if c else None


def _number(raw: dict, key: str, where: str, low: float = 0.0) -> float:
    if key not in raw:
        raise ValueError(f"{DESIGN_FILE}: {where} has no '{key}'")
    value = raw[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value < low:
        raise ValueError(f"{DESIGN_FILE}: {where}.{key} = {value!r}, expected a number >= {low}")
    return float(value)


def _part(key: str, raw: dict, where: str, pilot: dict[str, Components], eval_scale: float) -> PartDesign:
    delta, effect = _number(raw, "delta", where), _number(raw, "effect", where)
    if effect <= delta:
        raise ValueError(f"{DESIGN_FILE}: {where}: effect {effect} must exceed delta {delta} (an effect of "
                         "interest is larger than a negligible one)")
    if "metric" in raw:
        metric, versus = raw["metric"], raw.get("versus")
        if metric not in pilot:
            raise ValueError(f"{DESIGN_FILE}: {where}.metric {metric!r} has no components under pilot.scores")
        if versus not in VERSUS:
            raise ValueError(f"{DESIGN_FILE}: {where}.versus = {versus!r}, expected one of {VERSUS}")
        c = pilot[metric]
        sd = inf.diff_sd((c.sigma_t, c.sigma_t if versus == "trained" else 0.0), c.sigma_e, c.rho_e, eval_scale)
        return PartDesign(key, delta, effect, sd, "paired", metric, versus)
    design = raw.get("design")
    if design not in DESIGNS:
        raise ValueError(f"{DESIGN_FILE}: {where}.design = {design!r}, expected one of {DESIGNS} (or a metric)")
    return PartDesign(key, delta, effect, _number(raw, "sd", where), design)


def parse(raw: dict) -> Design:
    """A Design from study_design.yaml's content; errors name the key."""
    eval_scale = _number(raw, "eval_scale", "top level")
    pilot = {m: Components(_number(c, "sigma_t", f"pilot.scores.{m}"), _number(c, "sigma_e", f"pilot.scores.{m}"),
                           float(c.get("rho_e", 0.0)))
             for m, c in (raw.get("pilot", {}).get("scores") or {}).items()}
    claims = {}
    for number, c in (raw.get("claims") or {}).items():
        where = f"claims.{number}"
        parts = {str(k): _part(str(k), p, f"{where}.parts.{k}", pilot, eval_scale)
                 for k, p in (c.get("parts") or {}).items()}
        if not parts:
            raise ValueError(f"{DESIGN_FILE}: {where} has no parts")
        claims[int(number)] = ClaimDesign(int(number), str(c.get("text", "")), parts, bool(c.get("best", False)))
    alpha = _number(raw, "alpha", "top level")
    if abs(alpha - inf.ALPHA) > 1e-12:
        raise ValueError(f"{DESIGN_FILE}: alpha = {alpha}, but the report's tests run at {inf.ALPHA}")
    return Design(alpha, _number(raw, "power", "top level"), eval_scale, pilot, claims)


def read(path: Path) -> Design:
    import yaml

    return parse(yaml.safe_load(Path(path).read_text()))


def power_rows(design: Design, seeds: int) -> list[list[str]]:
    """Per claim: its parts, its power at `seeds` seeds and the seeds for design.power."""
    rows = []
    for c in design.claims.values():
        need = c.seeds(design.power)
        rows.append([str(c.number), str(len(c.parts)), f"{c.power(seeds):.0%}",
                     str(need) if need is not None else f"> {inf.MAX_SEEDS}"])
    return rows

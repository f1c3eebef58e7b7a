"""Intervals of the headline scores: a t-interval over seeds, and the older crossed bootstrap.

A score of the study depends on the seed (training run and image seeds) and on the test
prompts. The prompts are fixed and shared by every method and seed, so the report's intervals
are about this prompt set: the unit of replication is the seed. The evaluate stage writes
reports/eval/<target>/per_prompt.json (per seed, one score per prompt); from it

- `t_interval` (the report's): the headline statistic per seed (mean over groups, tag or
  category, of the group's mean over its prompts), then a t-interval over seeds
  (report/inference.py): one-sample for a target, paired by seed for A − B (the same seeds,
  image seeds and prompts). Each seed's score averages its evaluation, so the evaluation noise
  is inside the seed-to-seed spread the interval is built from (the nested model); at 3 seeds
  it covers 95% (tests/test_calibration.py) where the bootstrap's covers about 75%;
- `bootstrap` (kept for probes/power.py's variance decomposition): resamples seeds and,
  independently, the distinct prompts within each group (the same prompt draw for every
  seed); a paired A − B uses the same draws; the percentile interval of `DRAWS` draws from a
  numpy Generator seeded with `BOOT_SEED`. A group that lists its whole prompt space
  (single_object's four prompts, say) is the population: only the seeds are resampled there.

A prompt with a missing value (None / NaN) in a seed used is left out; a group with no
prompts is left out of the mean over groups. Rows of a group that repeat a prompt text are
one resampling unit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

DRAWS, LEVEL, BOOT_SEED = 2000, 0.95, 0
# The headline scores use prompts never trained on: unseen combinations of the trained tags
# ("test") and the test-only tags no model trains on ("unseen_tag"); "novel" (an
# attribute-object binding never seen in training) is reported apart.
# "reused" (training prompts under fresh image seeds) is what the 4-shape world's small
# tags had; kept so a study evaluated then still reads as it was reported.
HEADLINE_SUBSETS, NOVEL_SUBSETS = ("test", "unseen_tag", "reused"), ("novel",)
# per_prompt.json score name -> the prompt field that groups it.
GROUP_FIELD = {"geneval": "tag", "proxy_geneval": "tag", "t2i": "category", "proxy_t2i": "category"}


@dataclass(frozen=True)
class Interval:
    """Point estimate and interval (t over seeds, or percentile of a bootstrap). seeds: seeds
    used; prompts: distinct prompts over the groups; sd: a bootstrap's draws' sd; seed_var:
    sample variance (ddof=1) over seeds of the per-seed statistic (NaN for one seed);
    prompt_var: variance of the seed-averaged statistic under the prompt draws alone."""
    point: float
    low: float
    high: float
    seeds: int
    prompts: int
    sd: float = 0.0
    seed_var: float = math.nan
    prompt_var: float = 0.0
    se: float = math.nan  # t-intervals: standard error of the point and its degrees of freedom
    df: float = math.nan

    def cell(self, signed: bool = False) -> str:
        f = "{:+.3f}" if signed else "{:.3f}"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{f.format(self.point)} (one seed: no interval)"
        return f"{f.format(self.point)} [{f.format(self.low)}, {f.format(self.high)}]"


def _seed_order(s: str):
    return (0, int(s)) if str(s).lstrip("-").isdigit() else (1, str(s))


def _array(rows: Mapping[str, Sequence[float | None]], seeds: list[str]) -> np.ndarray:
    return np.array([[math.nan if v is None else float(v) for v in rows[s]] for s in seeds], dtype=float)


def _rows(values, groups, minus):
    """(seeds used, [seeds, rows] values of A or of A − B) or None when no seed is left."""
    seeds = sorted(set(values) & set(minus) if minus is not None else set(values), key=_seed_order)
    if not seeds:
        return None
    x = _array(values, seeds)
    if minus is not None:
        x = x - _array(minus, seeds)
    if len(groups) != x.shape[1]:
        raise ValueError(f"{len(groups)} groups for {x.shape[1]} values per seed")
    return seeds, x


def t_interval(values: Mapping[str, Sequence[float | None]], groups: Sequence[str | None],
               minus: Mapping[str, Sequence[float | None]] | None = None, units: Sequence[str] | None = None,
               level: float = LEVEL) -> Interval | None:
    """t-interval over seeds of the mean over groups of the group's row mean; with `minus`
    the paired difference on the common seeds and the rows finite in both. NaN bounds with
    one seed; None when no seed or no row is left."""
    from margrpo.report.inference import one_sample

    got = _rows(values, groups, minus)
    if got is None:
        return None
    seeds, x = got
    units = list(units) if units is not None else [str(i) for i in range(x.shape[1])]
    strata: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        if g is not None and np.isfinite(x[:, i]).all():
            strata.setdefault(g, []).append(i)
    if not strata:
        return None
    per_seed = np.mean([x[:, rows].mean(axis=1) for rows in strata.values()], axis=0)  # [seeds]
    # Scores lie in [0, 1]: rounding to 1e-12 removes summation noise, so two targets equal on
    # every prompt give d = 0 exactly rather than a "significant" 1e-18 with se = 0.
    per_seed = np.round(per_seed, 12)
    est = one_sample(per_seed)
    low, high = est.interval(level)
    return Interval(point=float(est.d), low=float(low), high=float(high), seeds=len(seeds),
                    prompts=sum(len({units[i] for i in rows}) for rows in strata.values()),
                    seed_var=float(per_seed.var(ddof=1)) if len(seeds) > 1 else math.nan,
                    se=float(est.se), df=float(est.df))


def bootstrap(values: Mapping[str, Sequence[float | None]], groups: Sequence[str | None],
              minus: Mapping[str, Sequence[float | None]] | None = None, units: Sequence[str] | None = None,
              draws: int = DRAWS, level: float = LEVEL, seed: int = BOOT_SEED,
              complete: Sequence[bool] | None = None) -> Interval | None:
    """Crossed bootstrap of mean over groups of the group's row mean, averaged over seeds.

    values: seed -> one value per row; groups: the row's stratum (None: not in the
    statistic); minus: a second target's values (paired A − B on the common seeds);
    units: the row's resampling unit within its group (default: every row its own unit,
    e.g. pass the prompt texts); complete: per row, whether its group lists every prompt of
    its prompt space. A group whose rows are all complete is the whole population, not a
    sample of it: its prompts are not resampled (the finite-population limit; resampling
    them would add variance that does not exist), only the seeds. None when no seed or no
    row is left."""
    got = _rows(values, groups, minus)
    if got is None:
        return None
    seeds, x = got
    n_seeds, n_rows = x.shape
    units = list(units) if units is not None else [str(i) for i in range(n_rows)]
    strata: dict[str, dict[str, list[int]]] = {}
    for i, g in enumerate(groups):
        if g is not None and np.isfinite(x[:, i]).all():
            strata.setdefault(g, {}).setdefault(units[i], []).append(i)
    if not strata:
        return None
    x = np.where(np.isfinite(x), x, 0.0)  # rows left out get weight 0; 0 * nan would be nan
    rng = np.random.default_rng(seed)
    rows_b = np.arange(draws)[:, None]
    seed_counts = np.zeros((draws, n_seeds))
    np.add.at(seed_counts, (rows_b, rng.integers(0, n_seeds, (draws, n_seeds))), 1.0)
    weights, point_w = np.zeros((draws, n_rows)), np.zeros(n_rows)
    fixed = {g for g, unit_rows in strata.items()
             if complete is not None and all(complete[i] for rows in unit_rows.values() for i in rows)}
    for g, unit_rows in strata.items():
        sizes = np.array([len(r) for r in unit_rows.values()], dtype=float)
        k = len(sizes)
        counts = np.zeros((draws, k))
        draw = rng.integers(0, k, (draws, k))   # drawn for every group: the stream does not depend on `fixed`
        if g in fixed:
            counts[:] = 1.0
        else:
            np.add.at(counts, (rows_b, draw), 1.0)
        total = counts @ sizes  # rows of this group in each draw
        for j, rows in enumerate(unit_rows.values()):
            weights[:, rows] += (counts[:, j] / total)[:, None] / len(strata)
            point_w[rows] = 1.0 / (sizes.sum() * len(strata))
    seed_w = seed_counts / n_seeds
    stats = np.einsum("bp,bp->b", seed_w @ x, weights)
    per_seed = x @ point_w
    prompt_only = weights @ x.mean(axis=0)
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return Interval(point=float(per_seed.mean()), low=float(lo), high=float(hi), seeds=n_seeds,
                    prompts=sum(len(u) for u in strata.values()), sd=float(stats.std()),
                    seed_var=float(per_seed.var(ddof=1)) if n_seeds > 1 else math.nan,
                    prompt_var=float(prompt_only.var()))


def seeds_needed(iv: Interval, delta: float) -> float | None:
    """Seeds at which the interval's half-width would fall below delta / 2: narrow enough
    that the interval either excludes 0 or lies within (−delta, +delta), whatever the
    difference. Model: half-width(n) = c · sqrt(seed_var / n + prompt_var), c calibrated so
    that it is the measured half-width at the measured seeds; it assumes the seed-to-seed
    variance stays as measured and the same prompts (their component does not shrink with
    seeds), and c corrects the bootstrap's small-sample shrinkage of the seed part. None with one seed (no seed variance); inf when the prompts alone are too wide."""
    if not math.isfinite(iv.seed_var):
        return None
    half = (iv.high - iv.low) / 2
    var_now = iv.seed_var / iv.seeds + iv.prompt_var
    if half <= delta / 2:
        return float(iv.seeds)
    if var_now <= 0:
        return None
    # A bootstrap over n seeds resamples them with replacement, so its seed part is
    # (n - 1) / n of seed_var / n (ddof=1): undo that shrinkage before extrapolating to more
    # seeds (at 3 seeds the measured interval is about 0.82x the width it stands for).
    c2 = half ** 2 / var_now * iv.seeds / (iv.seeds - 1)
    room = (delta / 2) ** 2 / c2 - iv.prompt_var
    return math.inf if room <= 0 else float(max(iv.seeds, math.ceil(iv.seed_var / room)))


# ---- per_prompt.json ------------------------------------------------------------------

def metric_spec(metric: str) -> tuple[str, str | None] | None:
    """'eval/geneval/overall' -> ('geneval', None); 'eval/t2i/spatial' -> ('t2i', 'spatial');
    'eval/proxy/geneval/colors' -> ('proxy_geneval', 'colors'); None for other metrics."""
    rest = metric.removeprefix("eval/")
    proxy = rest.startswith("proxy/")
    kind, _, group = rest.removeprefix("proxy/").partition("/")
    if kind not in ("geneval", "t2i") or not group:
        return None
    return ("proxy_" if proxy else "") + kind, None if group in ("overall", "mean") else group


def read_per_prompt(reports: Path, target: str, seeds: Sequence | None = None) -> dict | None:
    """reports/eval/<target>/per_prompt.json restricted to `seeds` (all when None); None
    when the file is missing (records written before the evaluate stage wrote it)."""
    import json

    path = Path(reports) / "eval" / target / "per_prompt.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if seeds is not None:
        keep = {str(s) for s in seeds}
        for which in ("final", "best"):
            data[which] = {s: v for s, v in (data.get(which) or {}).items() if s in keep}
    return data


def _groups(data: dict, kind: str, subsets: Sequence[str], only: str | None) -> list[str | None]:
    field_ = GROUP_FIELD[kind]
    out = []
    for p in data["prompts"]:
        g = p.get(field_)
        ok = g is not None and p.get("subset", "test") in subsets and (only is None or g == only)
        out.append(g if ok else None)
    return out


def _scores(data: dict, which: str, kind: str) -> dict[str, list]:
    return {s: v[kind] for s, v in (data.get(which) or {}).items() if v.get(kind) is not None}


def score_interval(data: dict, metric: str, which: str = "final", minus: dict | None = None,
                   minus_which: str = "final", subsets: Sequence[str] = HEADLINE_SUBSETS,
                   method: str = "t", draws: int = DRAWS, seed: int = BOOT_SEED) -> Interval | None:
    """Interval of a report metric ('eval/geneval/overall', 'eval/t2i/spatial', ...) of one
    target's per_prompt.json, checkpoint `which` ('final' or 'best'); with `minus` (another
    target's per_prompt.json, checkpoint `minus_which`) the paired difference. method: 't' (the
    report's t-interval over seeds) or 'bootstrap'. None when the metric has no per-prompt
    scores or no prompts of these subsets."""
    spec = metric_spec(metric)
    if spec is None or spec[0] not in GROUP_FIELD:
        return None
    kind, only = spec
    groups = _groups(data, kind, subsets, only)
    units = [p["prompt"] for p in data["prompts"]]
    complete = _complete(data["prompts"])
    other = None
    if minus is not None:
        if [p["prompt"] for p in minus["prompts"]] != units:
            raise ValueError("per_prompt.json of the two targets list different prompts")
        other = _scores(minus, minus_which, kind)
    if method == "t":
        return t_interval(_scores(data, which, kind), groups, other, units)
    return bootstrap(_scores(data, which, kind), groups, other, units, draws=draws, seed=seed, complete=complete)


def _complete(prompts: list[dict]) -> list[bool]:
    """Per prompt row: whether the file lists every prompt of its purpose and subset (the
    row's "pool", the size of that prompt space, written by the evaluate stage)."""
    listed: dict[tuple, set] = {}
    for p in prompts:
        listed.setdefault((p.get("tag") or p.get("category"), p.get("subset", "test")), set()).add(p["prompt"])
    return [p.get("pool") is not None and len(listed[(p.get("tag") or p.get("category"), p.get("subset", "test"))])
            >= p["pool"] for p in prompts]


def has_subset(data: dict, subsets: Sequence[str]) -> bool:
    return any(p.get("subset", "test") in subsets for p in data["prompts"])


def prompt_counts(data: dict) -> dict[str, dict[str, int]]:
    """subset -> {'all': distinct prompt texts, '<tag or category>': distinct texts} (a
    prompt with a tag and a category counts in both)."""
    out: dict[str, dict[str, set]] = {}
    for p in data["prompts"]:
        sub = out.setdefault(p.get("subset", "test"), {})
        for g in ("all", p.get("tag"), p.get("category")):
            if g is not None:
                sub.setdefault(g, set()).add(p["prompt"])
    return {s: {g: len(v) for g, v in groups.items()} for s, groups in out.items()}

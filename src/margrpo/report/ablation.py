"""The ablation grid of claim 4 and the long run: their design, their committed records, and
the report's section on them.

Design (`grid`): one factor at a time around the study's defaults (k = 0.3, M = 4, committed
tokens only), each experiment retraining both multi-trajectory estimators, the paper's
`resample` and the corrected `posterior`:
- k in {0.1, 0.5, 1.0}; the study itself is the point k = 0.3, its grpo_frozen the point k = 0;
- num_trajectories M in {2, 8}; the study is M = 4;
- tau in {-1, 0, 0.5}: tau filters speculative tokens only, so this arm scores the committed
  tokens plus the speculative ones that pass the consistency filter (token_scope
  committed+speculative, consistency on); tau = -1 keeps every speculative token (filter off);
- the long run: grpo, grpo_frozen and the two estimators for LONG_FACTOR x train.steps steps.
A full product (4 k x 3 M x 3 tau) would be 36 experiments against these 9.

Records (scripts/ablation.py writes them from finished DVC experiments; this module only
reads them): reports/ablation/<experiment>.json, and centre-<code>.json, the study the
experiments started from. A record holds
  name, arm ("k" | "M" | "tau" | "long" | "centre"), commit, baseline, code, study, overrides,
  knobs {"k", "tau", "num_trajectories", "seeds"}, summary (the experiment's summary.json),
  methods {name: {"role", "config" (its params.yaml block), "steps", "per_prompt" (the final
           checkpoints' per-prompt scores, reports/eval/<m>/per_prompt.json's layout),
           "train_minutes" (per seed), "history" and "evals" ({seed: rows})}}
for the methods the experiment retrained (the centre: every method of the study). `code` is
a fingerprint of what the training and evaluation stages read except the grid's knobs: two
points are compared only when their fingerprints, method blocks and other knobs are equal,
so every comparison differs in one knob and is paired by seed, prompt and image seed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from margrpo.config import BUDGET_DEFAULTS, NO_KNOB
from margrpo.report.blocks import BLOCKS, block_stats
from margrpo.report.curves import train_stats
from margrpo.report.claims import (DELTA, FAILS, HOLDS, NO_DIFF, UNSURE, Claim, Part, build_claims, interval_part,
                                   interval_verdict, knob_claim)
from margrpo.report.figures import interval_figure, plot_curves
from margrpo.report.intervals import score_interval
from margrpo.report.render import Figure, Section, Table
from margrpo.stats import mean_std

OVERALL = "eval/geneval/overall"
ESTIMATORS = ("resample", "posterior")
# claim 4 (method.md §6): "k = 0.3 is the best trade-off; tau = 0 is best"; M = 4 the study's.
CENTRE = {"k": 0.3, "num_trajectories": 4, "tau": 0.0}
K_VALUES, M_VALUES, TAU_VALUES = (0.1, 0.3, 0.5, 1.0), (2, 4, 8), (-1.0, 0.0, 0.5)
KNOB_LABEL = {"k": "k (top uncertain fraction)", "num_trajectories": "M (trajectories)", "tau": "tau (consistency)"}
SPECULATIVE = {"token_scope": "committed+speculative", "consistency": "true"}
LONG_FACTOR = 10
LONG_ROLES = ("grpo", "grpo_frozen", "resample", "posterior")
# Per-step keys kept in a record: the long run's curves and the claims 1-2 statistics.
HISTORY_KEYS = ("reward/mean", "judge/correct", "loss/kl", "diag/grad_norm_ar", "diag/grad_norm_head", "time/step",
                "probe/var_ratio_vs_single", "probe/snr")
LONG_CURVES = ("eval/geneval/overall", "judge/correct", "reward/mean", "loss/kl", "diag/grad_norm_ar",
               "diag/grad_norm_head")
# A table row's verdict, read from the interval of centre − this row.
VERSUS_CENTRE = {HOLDS: "below the centre", FAILS: "above the centre", NO_DIFF: f"within ±{DELTA} of the centre",
                 UNSURE: "inconclusive"}
# Paired comparisons of the long run's test scores: (better, worse) roles.
LONG_PAIRS = (("grpo", "grpo_frozen"), ("resample", "grpo_frozen"), ("posterior", "grpo_frozen"),
              ("posterior", "resample"))


@dataclass(frozen=True)
class Point:
    """One DVC experiment of the grid: its name (dvc exp run -n), arm, knob value, the -S
    overrides, and the methods (role -> name) it is there to retrain."""
    name: str
    arm: str
    value: float
    overrides: tuple[str, ...]
    methods: dict = field(default_factory=dict, compare=False)


def roles(methods: Mapping[str, Mapping]) -> dict[str, str]:
    """role -> the first method of params.yaml's `methods` that plays it, among those at the
    study's budget: grpo (head trained, single chain), grpo_frozen (head frozen, single
    chain, committed tokens), resample / posterior (head frozen, that estimator on the
    top-k tokens, committed tokens)."""
    out: dict[str, str] = {}
    for name, c in methods.items():
        if any(c.get(k, v) != v for k, v in BUDGET_DEFAULTS.items()):
            continue
        plain = c.get("token_scope", "committed") == "committed" and not c.get("consistency", False)
        est = c.get("estimator", "single")
        if est == "single" and plain:
            out.setdefault("grpo_frozen" if c.get("freeze_head") else "grpo", name)
        elif est in ESTIMATORS and plain and c.get("freeze_head") and c.get("topk"):
            out.setdefault(est, name)
    return out


def grid(methods: Mapping[str, Mapping]) -> list[Point]:
    """The experiments of the ablation and the long run for params.yaml's `methods`
    (module docstring). ValueError names a role the study lacks and the fix."""
    r = roles(methods)
    missing = [x for x in LONG_ROLES if x not in r]
    if missing:
        raise ValueError(
            f"params.yaml methods has no method for {', '.join(missing)}: the grid needs, at the study's budget, "
            "grpo (freeze_head: false), grpo_frozen (freeze_head: true, estimator: single) and a frozen-head top-k "
            "method per estimator (estimator: resample and estimator: posterior, topk: true); add the missing one to "
            "params.yaml's methods (dvc.yaml's stages iterate over them) and commit the study with it (dvc repro) "
            "before queueing")
    mte = {e: r[e] for e in ESTIMATORS}
    points = [Point(f"abl-k{v:g}", "k", v, (f"k={v:g}",), mte) for v in K_VALUES if v != CENTRE["k"]]
    points += [Point(f"abl-m{v}", "M", v, (f"num_trajectories={v}",), mte) for v in M_VALUES
               if v != CENTRE["num_trajectories"]]
    spec = tuple(_set(m, methods[m], key, val) for m in mte.values() for key, val in SPECULATIVE.items())
    spec += tuple(o for m in mte.values() for o in _reading_tau(m, methods[m]))
    points += [Point(f"abl-tau{v:g}", "tau", v, (f"tau={v:g}", *spec), mte) for v in TAU_VALUES]
    long = {x: r[x] for x in LONG_ROLES}
    points.append(Point(f"long-x{LONG_FACTOR}", "long", LONG_FACTOR,
                        tuple(_set(m, methods[m], "steps_factor", LONG_FACTOR) for m in long.values()), long))
    return points


def _reading_tau(name: str, config: Mapping) -> tuple[str, ...]:
    """The override that makes a method read tau (its `reads` names the knobs it trains
    with; the consistency filter needs tau), in place of an entry that names no knob (three
    entries and tau not among them: one at least names none)."""
    reads = list(config.get("reads") or [])
    if not reads or "tau" in reads:
        return ()
    reads[reads.index(NO_KNOB)] = "tau"
    return (_set(name, config, "reads", f"[{','.join(reads)}]"),)


def _set(name: str, config: Mapping, key: str, value) -> str:
    """`-S` override of a method key; `+` for a key its block does not list (DVC refuses to
    set an absent key without it, and to add one that is there)."""
    return f"{'' if key in config else '+'}methods.{name}.{key}={value}"


def read_records(folder: Path) -> list[dict]:
    """Every record in folder (reports/ablation), centres first; [] without the folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return sorted(records, key=lambda r: (r["arm"] != "centre", r["name"]))


# ---- points and their comparisons ------------------------------------------------------

@dataclass
class Series:
    """The points of one method that differ in `knob` alone (same code, method block and
    other knobs): value -> (record name, per-prompt scores, method name)."""
    knob: str
    method: str
    role: str | None
    points: dict[float, tuple[str, dict, str]]

    @property
    def label(self) -> str:
        return self.method if not self.role or self.role == self.method else f"{self.method} ({self.role})"


def series(records: list[dict], knob: str) -> list[Series]:
    """Every group of two or more points (record, method) that differ only in `knob`. A k
    series of an estimator also gets the point k = 0 (no token scored by several chains:
    grpo_frozen of the centre study among its points: same code, seeds and token scope)."""
    groups: dict[str, Series] = {}
    for rec in records:
        if rec["arm"] == "long":
            continue
        for m, entry in rec["methods"].items():
            if not entry.get("per_prompt"):
                continue
            others = {k: v for k, v in rec["knobs"].items() if k not in (knob, "seeds")}
            key = json.dumps([rec["code"], m, entry["config"], others], sort_keys=True)
            s = groups.setdefault(key, Series(knob, m, entry.get("role"), {}))
            s.points.setdefault(float(rec["knobs"][knob]), (rec["name"], entry["per_prompt"], m))
    if knob == "k":
        for s in groups.values():
            if s.role in ESTIMATORS and (zero := _frozen_centre(records, s)):
                s.points.setdefault(0.0, zero)
    return [s for s in groups.values() if len(s.points) > 1]


def _frozen_centre(records: list[dict], s: Series) -> tuple[str, dict, str] | None:
    """(record name, per-prompt scores, method) of grpo_frozen in the centre study that is a
    point of `s` (so the series scores what grpo_frozen scores: committed tokens)."""
    names = {name for name, _, _ in s.points.values()}
    for rec in records:
        if rec["arm"] == "centre" and rec["name"] in names:
            for m, entry in rec["methods"].items():
                if entry.get("role") == "grpo_frozen" and entry.get("per_prompt"):
                    return rec["name"], entry["per_prompt"], m
    return None


def _cell(iv, signed: bool = False) -> str:
    if iv is None:
        return "–"
    return iv.cell(signed) if iv.seeds > 1 else f"{iv.cell(signed)} (one seed: prompts only)"


def comparisons(s: Series, centre: float) -> list[tuple[float, Part]]:
    """Parts "centre − value" of a series for every value but the centre (none when the
    series lacks the centre value)."""
    if centre not in s.points:
        return []
    _, pp_c, _ = s.points[centre]
    out = []
    for v, (_, pp, method) in sorted(s.points.items()):
        other = f"{s.knob}={v:g}" + ("" if method == s.method else f" ({method})")
        if v != centre and (part := interval_part(f"GenEval overall, {s.knob}={centre:g} − {other} ({s.label})",
                                                  pp_c, pp, OVERALL)):
            out.append((v, part))
    return out


def claim4(records: list[dict]) -> Claim | None:
    """Claim 4 (claims.knob_claim) from every series of the two estimators that holds the
    centre value: k = 0.3 against every other k, tau = 0 against every other tau."""
    parts: dict[str, list[Part]] = {e: [] for e in ESTIMATORS}
    ran = set()
    for knob in ("k", "tau"):
        for s in series(records, knob):
            if s.role in parts:
                parts[s.role] += [p for _, p in comparisons(s, CENTRE[knob])]
                ran |= {(knob, v) for v in s.points}
    todo = [f"{k}={v:g}" for k, values in (("k", K_VALUES), ("tau", TAU_VALUES)) for v in values if (k, v) not in ran]
    return knob_claim(parts, todo)


# ---- the report section ----------------------------------------------------------------

def _minutes(entry: dict) -> str:
    mins = entry.get("train_minutes") or []
    return f"{mean_std(mins)[0]:.1f}" if mins else "–"


def grid_table(records: list[dict]) -> tuple[Table, list[tuple[str, dict[str, list]]]]:
    """Rows per series point (knob value, score, difference to the centre value with its
    verdict) and the figure's panels."""
    rows, panels = [], []
    by_name = {r["name"]: r for r in records}
    for knob in ("k", "num_trajectories", "tau"):
        lines: dict[str, list] = {}
        for s in series(records, knob):
            diffs = dict(comparisons(s, CENTRE[knob]))
            for v, (name, pp, method) in sorted(s.points.items()):
                iv = score_interval(pp, OVERALL)
                if iv is not None:
                    lines.setdefault(s.label, []).append((v, iv.point, iv.low, iv.high))
                part = diffs.get(v)
                if part is None:
                    diff = "centre" if v == CENTRE[knob] else "–"
                else:  # the part is centre − value; the table reads value − centre
                    iv_d = part.interval
                    diff = (f"{0.0 - iv_d.point:+.3f} [{0.0 - iv_d.high:+.3f}, {0.0 - iv_d.low:+.3f}] "
                            f"({VERSUS_CENTRE[interval_verdict(iv_d)]})")
                label = s.label if method == s.method else f"{method} (k = 0 of {s.label})"
                rows.append([KNOB_LABEL[knob], f"{v:g}", label, name, _cell(iv), diff,
                             _minutes(by_name[name]["methods"][method])])
        if lines:
            panels.append((KNOB_LABEL[knob], lines))
    header = ["knob", "value", "method", "experiment", "GenEval overall [95%]", "this − centre [95%] (verdict)",
              "train min / seed"]
    return Table(header, rows), panels


def long_run(records: list[dict], figures: Path) -> list[Section]:
    """A section per long-run record: its curves, test scores, paired comparisons and claims
    1 and 2 judged on its histories."""

    sections = []
    for rec in (r for r in records if r["arm"] == "long"):
        by_role = {e.get("role"): m for m, e in rec["methods"].items()}
        histories = _histories(rec)
        claims, one_seed = long_claims(rec)
        curves = {m: {s: rows + e.get("evals", {}).get(str(s), []) for s, rows in histories[m].items()}
                  for m, e in rec["methods"].items()}
        steps = sorted({e["steps"] for e in rec["methods"].values()})
        sec = Section(f"Long run: {rec['name']}", [
            f"{', '.join(rec['methods'])} for {'/'.join(map(str, steps))} steps, seeds {rec['knobs']['seeds']} "
            f"(experiment commit {rec['commit'][:10]}, reports/ablation/{rec['name']}.json). Curves: "
            "eval/geneval/overall is the judge's score of the validation prompts during training (the first "
            "point is the base), judge/correct the judge's score of each step's training images; mean over seeds, "
            "band ± 1 std. Test scores and paired comparisons by the claims' rule; claims 1 and 2 by the "
            "claims' rules on these histories (first and last quarter of the steps), the long run's methods at "
            "the same budget (a method it retrained at the study's budget is left out)"
            + (f". One seed: the replicates of claims 1 and 2 are the {BLOCKS} consecutive blocks of each window "
               "(report/blocks.py), so 2se is the spread of block means within this run, a lower bound on its "
               "uncertainty (neighbouring steps are correlated), and says nothing of the seed-to-seed spread"
               if one_seed else "") + "."], anchor=f"long-{rec['name']}")
        if path := plot_curves(curves, list(LONG_CURVES), figures / f"{rec['name']}_curves.png"):
            sec.figures.append(Figure(path, f"{rec['name']}: " + ", ".join(LONG_CURVES)))
        rows = []
        for m, e in rec["methods"].items():
            iv = score_interval(e["per_prompt"], OVERALL) if e.get("per_prompt") else None
            rows.append([m, str(e["steps"]), _cell(iv), _minutes(e)])
        sec.tables.append(Table(["method", "steps", "test GenEval overall [95%]", "train min / seed"], rows))
        parts = [p for a, b in LONG_PAIRS if a in by_role and b in by_role
                 and rec["methods"][by_role[a]].get("per_prompt") and rec["methods"][by_role[b]].get("per_prompt")
                 and (p := interval_part(f"GenEval overall, {by_role[a]} − {by_role[b]}",
                                         rec["methods"][by_role[a]]["per_prompt"],
                                         rec["methods"][by_role[b]]["per_prompt"], OVERALL))]
        sec.tables.append(Table(["comparison / claim", "verdict", "evidence"],
                                [[p.text, p.status, p.render()] for p in parts]
                                + [[f"claim {c.number}: {c.claim}", c.status, [p.render() for p in c.parts] or "–"]
                                   for c in claims]))
        sections.append(sec)
    return sections


def _histories(rec: dict) -> dict[str, dict[int, list[dict]]]:
    """method -> seed -> the record's per-step training history."""
    return {m: {int(s): rows for s, rows in e.get("history", {}).items()} for m, e in rec["methods"].items()}


def long_claims(rec: dict) -> tuple[list[Claim], bool]:
    """Claims 1 and 2 on a long-run record's training histories, and whether they had one
    seed. Replicates: the seeds, or with one seed the blocks of its windows (block_stats)."""
    # The methods of the long run (those with a role) train the same number of steps: compare
    # them as equals. A method the long run retrained at the study's budget is left out.
    configs = {m: {k: v for k, v in e["config"].items() if k not in BUDGET_DEFAULTS}
               for m, e in rec["methods"].items() if e.get("role") in LONG_ROLES}
    histories = {m: h for m, h in _histories(rec).items() if m in configs and h}
    one_seed = bool(histories) and all(len(h) == 1 for h in histories.values())
    stats = {m: block_stats(next(iter(h.values()))) if one_seed else train_stats(h) for m, h in histories.items()}
    claims = [c for c in build_claims(stats, {}, configs, {}) if c.number in (1, 2)]
    if one_seed:
        for part in (p for c in claims for p in c.parts):
            part.needed = None  # blocks, not seeds: no seed count follows from their spread
    return claims, one_seed


def note_long_verdicts(claims: list[Claim], records: list[dict]) -> None:
    """Add each long run's verdict on claims 1 and 2 to the notes of the study's claims (the
    study's own verdict stays: the claims table judges the study's run)."""
    by_number = {c.number: c for c in claims}
    for rec in (r for r in records if r["arm"] == "long"):
        steps = max((e["steps"] for e in rec["methods"].values()), default=0)
        long, one_seed = long_claims(rec)
        for c in long:
            if (main := by_number.get(c.number)) and any(p.d is not None for p in c.parts):
                kind = f"seed {rec['knobs']['seeds'][0]}, replicates: {BLOCKS} blocks of one run" if one_seed \
                    else f"seeds {rec['knobs']['seeds']}"
                line = (f"long run {rec['name']} ({steps} steps, {kind}): {c.status} "
                        f"(report section 'Long run: {rec['name']}')")
                main.note = f"{main.note}; {line}" if main.note else line


def section(records: list[dict], figures: Path) -> tuple[list[Section], Claim | None, dict]:
    """The report's ablation sections (the grid, then one per long run), claim 4 and the
    summary.json entries (`ablation`: '<experiment>/<method>' -> GenEval overall);
    ([], None, {}) without records."""
    if not records:
        return [], None, {}
    figures = Path(figures)
    table, panels = grid_table(records)
    sections = []
    if table.rows:
        sec = Section("Ablations: k, M and tau", [
            "Committed records of the ablation experiments (reports/ablation/, written by python "
            "scripts/ablation.py from the finished DVC experiments). One knob at a time around the study (k = 0.3, "
            "M = 4, committed tokens); the tau rows score the committed tokens plus the speculative ones that pass "
            "the consistency filter (tau = -1 keeps all of them). A row's difference is paired with the centre "
            "value of its knob (k = 0.3, M = 4, tau = 0) on the same seeds, prompts and image seeds; verdicts by "
            f"the claims' rule (δ = {DELTA}: '{NO_DIFF}' when the interval lies within ±δ). Points are compared "
            "only when everything but the knob is equal (code, other params, method block)."], [table],
            anchor="ablation")
        if path := interval_figure(panels, figures / "ablation_knobs.png", "test GenEval overall"):
            sec.figures.append(Figure(path, "Test GenEval overall against k, M and tau (95% interval over seeds "
                                            "and prompts), one line per method"))
        sections.append(sec)
    sections += long_run(records, figures)
    summary = {}
    for rec in records:
        for m, e in rec["methods"].items():
            if rec["arm"] != "centre" and e.get("per_prompt") and (iv := score_interval(e["per_prompt"], OVERALL)):
                summary[f"{rec['name']}/{m}"] = iv.point
    return sections, claim4(records), summary

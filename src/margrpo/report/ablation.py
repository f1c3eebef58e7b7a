"""The ablation grid of claim 4 and the long run: their design, their committed records, and
the report's section on them.

Design (`grid`): one factor at a time around the study (its centre: params.yaml's k,
num_trajectories and tau, with committed tokens only), each experiment retraining the methods
of both multi-trajectory estimators (the roles of params.yaml's `claims`: the paper's
`resample` and the corrected `posterior`), at the values OTHER_VALUES sets besides the centre's:
- k in {0.1, 0.5, 1.0}; the study itself is the point at its k, its grpo_frozen the point k = 0;
- num_trajectories M in {2, 8}; the study is the point at its M;
- tau in {-1, 0.5} and the study's tau: tau filters speculative tokens only, so this arm
  scores the committed tokens plus the speculative ones that pass the consistency filter
  (token_scope committed+speculative, consistency on), its centre included; tau = -1 keeps
  every speculative token (filter off). Consistency makes a method read tau; inside the
  experiment its train stage reruns anyway (its methods.<m> block changed), and the
  pipeline's guard notes that dvc.yaml lists tau for it only once the settings are
  committed (python -m pipeline.dvcyaml);
- the long run: the methods of the roles LONG_ROLES for LONG_FACTOR x train.steps steps.
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
so every comparison differs in one knob and is paired by seed, prompt and image seed. The
centre value of a knob is the centre record's (the study the experiments of that code
started from).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from margrpo.config import BUDGET_DEFAULTS, KNOBS, ClaimsConfig, Knobs
from margrpo.report.blocks import BLOCKS, block_stats
from margrpo.report.curves import train_stats
from margrpo.report.claims import (DELTA, FAILS, HOLDS, NO_DIFF, UNSURE, Claim, Part, build_claims, interval_part,
                                   interval_verdict, knob_claim)
from margrpo.report.figures import interval_figure, plot_curves
from margrpo.report.intervals import score_interval
from margrpo.report.render import Figure, Section, Table
from margrpo.stats import mean_std

OVERALL = "eval/geneval/overall"
# The roles (params.yaml `claims`) whose estimator the grid varies the knobs of.
ABLATED_ESTIMATORS = ("resample", "posterior")
# The values each arm sets besides the centre's (the study's own k, num_trajectories and tau).
OTHER_VALUES = {"k": (0.1, 0.5, 1.0), "num_trajectories": (2, 8), "tau": (-1.0, 0.5)}
KNOB_LABEL = {"k": "k (top uncertain fraction)", "num_trajectories": "M (trajectories)", "tau": "tau (consistency)"}
SPECULATIVE = {"token_scope": "committed+speculative", "consistency": "true"}
LONG_FACTOR = 10
# The roles (params.yaml `claims`) whose methods the long run trains for LONG_FACTOR x train.steps.
LONG_ROLES = ("grpo", "grpo_frozen", *ABLATED_ESTIMATORS)
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


def roles(params: Mapping) -> dict[str, str]:
    """role -> method, from the `claims` section of a raw params tree (params.yaml as loaded;
    ClaimsConfig says what each role is); the roles no method plays are left out."""
    if "methods" not in params:
        raise TypeError("roles() takes the whole params tree (params.yaml as loaded, with its `claims`), not its "
                        "`methods` alone")
    return ClaimsConfig.model_validate(params.get("claims") or {}).roles()


def arm_values(knob: str, centre: float) -> tuple[float, ...]:
    """The knob values of an arm: OTHER_VALUES' but the centre (the study itself), and in the
    tau arm the centre too (its speculative tokens make the centre an experiment of its own)."""
    values = set(OTHER_VALUES[knob])
    return tuple(sorted(values | {centre} if knob == "tau" else values - {centre}))


def grid(params: Mapping) -> list[Point]:
    """The experiments of the ablation and the long run for a raw params tree (params.yaml as
    loaded: its `methods`, `claims` and knobs; module docstring). ValueError names a role the
    study lacks and the fix."""
    r, methods = roles(params), params["methods"]
    missing = [x for x in LONG_ROLES if x not in r]
    if missing:
        raise ValueError(
            f"params.yaml claims has no method for {', '.join(missing)}: the grid retrains the methods of the roles "
            f"{', '.join(LONG_ROLES)} (ClaimsConfig in src/margrpo/config.py says what each is); add the method to "
            "params.yaml's methods if it is missing (then python -m pipeline.dvcyaml), name it under claims, and "
            "commit the study with it (dvc repro) before queueing")
    centre = Knobs.model_validate({k: params[k] for k in KNOBS if k in params})
    mte = {e: r[e] for e in ABLATED_ESTIMATORS}
    points = [Point(f"abl-k{v:g}", "k", v, (f"k={v:g}",), mte) for v in arm_values("k", centre.k)]
    points += [Point(f"abl-m{v}", "M", v, (f"num_trajectories={v}",), mte)
               for v in arm_values("num_trajectories", centre.num_trajectories)]
    spec = tuple(_set(m, methods[m], key, val) for m in mte.values() for key, val in SPECULATIVE.items())
    points += [Point(f"abl-tau{v:g}", "tau", v, (f"tau={v:g}", *spec), mte) for v in arm_values("tau", centre.tau)]
    long = {x: r[x] for x in LONG_ROLES}
    points.append(Point(f"long-x{LONG_FACTOR}", "long", LONG_FACTOR,
                        tuple(_set(m, methods[m], "steps_factor", LONG_FACTOR) for m in long.values()), long))
    return points


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
    other knobs): value -> (record name, per-prompt scores, method name); centre: the knob's
    value in the study the points' experiments started from (None without its record)."""
    knob: str
    method: str
    role: str | None
    points: dict[float, tuple[str, dict, str]]
    centre: float | None = None

    @property
    def label(self) -> str:
        return self.method if not self.role or self.role == self.method else f"{self.method} ({self.role})"


def centres(records: list[dict]) -> dict[str, dict]:
    """code -> the knobs of the study its experiments started from (the centre record)."""
    return {rec["code"]: rec["knobs"] for rec in records if rec["arm"] == "centre"}


def series(records: list[dict], knob: str) -> list[Series]:
    """Every group of two or more points (record, method) that differ only in `knob`. A k
    series of an estimator also gets the point k = 0 (no token scored by several chains:
    grpo_frozen of the centre study among its points: same code, seeds and token scope)."""
    groups: dict[str, Series] = {}
    centre = centres(records)
    for rec in records:
        if rec["arm"] == "long":
            continue
        for m, entry in rec["methods"].items():
            if not entry.get("per_prompt"):
                continue
            others = {k: v for k, v in rec["knobs"].items() if k not in (knob, "seeds")}
            key = json.dumps([rec["code"], m, entry["config"], others], sort_keys=True)
            value = centre.get(rec["code"], {}).get(knob)
            s = groups.setdefault(key, Series(knob, m, entry.get("role"), {}, None if value is None else float(value)))
            s.points.setdefault(float(rec["knobs"][knob]), (rec["name"], entry["per_prompt"], m))
    if knob == "k":
        for s in groups.values():
            if s.role in ABLATED_ESTIMATORS and (zero := _frozen_centre(records, s)):
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
    return iv.cell(signed)


def comparisons(s: Series) -> list[tuple[float, Part]]:
    """Parts "centre − value" of a series for every value but the centre (none when the
    series lacks the centre value)."""
    centre = s.centre
    if centre not in s.points:
        return []
    _, pp_c, _ = s.points[centre]
    out = []
    for v, (_, pp, method) in sorted(s.points.items()):
        other = f"{s.knob}={v:g}" + ("" if method == s.method else f" ({method})")
        if v != centre and (part := interval_part(f"GenEval overall, {s.knob}={centre:g} − {other} ({s.label})",
                                                  pp_c, pp, OVERALL)):
            part.key = f"{s.knob}={v:g}"  # its name in study_design.yaml
            out.append((v, part))
    return out


def claim4(records: list[dict]) -> Claim | None:
    """Claim 4 (claims.knob_claim) from every series of the two estimators that holds the
    centre value: the study's k (0.3, the paper's) against every other k, its tau (0)
    against every other tau."""
    parts: dict[str, list[Part]] = {e: [] for e in ABLATED_ESTIMATORS}
    ran = set()
    for knob in ("k", "tau"):
        for s in series(records, knob):
            if s.role in parts:
                parts[s.role] += [p for _, p in comparisons(s)]
                ran |= {(knob, v) for v in s.points}
    planned = {(k, float(v)) for c in centres(records).values() for k in ("k", "tau")
            for v in (c[k], *arm_values(k, c[k]))}
    todo = [f"{k}={v:g}" for k, v in sorted(planned, key=lambda kv: (kv[0] != "k", kv[1])) if (k, v) not in ran]
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
    for knob in KNOB_LABEL:
        lines: dict[str, list] = {}
        for s in series(records, knob):
            diffs = dict(comparisons(s))
            for v, (name, pp, method) in sorted(s.points.items()):
                iv = score_interval(pp, OVERALL)
                if iv is not None:
                    lines.setdefault(s.label, []).append((v, iv.point, iv.low, iv.high))
                part = diffs.get(v)
                if part is None:
                    diff = "centre" if v == s.centre else "–"
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
    roles = {e["role"]: m for m, e in rec["methods"].items() if m in configs}
    claims = [c for c in build_claims(stats, {}, configs, roles, {}) if c.number in (1, 2)]
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


def _centre_text(records: list[dict], knobs: tuple[str, ...]) -> str:
    """'k = 0.3, M = 4, ' for the centre record's knobs (the first centre's), '' without one."""
    c = next(iter(centres(records).values()), None)
    return "".join(f"{KNOB_LABEL[k].split()[0]} = {c[k]:g}, " for k in knobs) if c else ""


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
            f"scripts/ablation.py from the finished DVC experiments). One knob at a time around the study "
            f"({_centre_text(records, ('k', 'num_trajectories'))}committed tokens); the tau rows score the "
            "committed tokens plus the speculative ones that pass the consistency filter (tau = -1 keeps all of "
            f"them). A row's difference is paired with the centre value of its knob "
            f"({_centre_text(records, tuple(KNOB_LABEL)).removesuffix(', ') or 'the study'}) on the same seeds, prompts "
            "and image seeds; verdicts by "
            f"the claims' rule (δ = {DELTA}: '{NO_DIFF}' when the interval lies within ±δ). Points are compared "
            "only when everything but the knob is equal (code, other params, method block)."], [table],
            anchor="ablation")
        if path := interval_figure(panels, figures / "ablation_knobs.png", "test GenEval overall"):
            sec.figures.append(Figure(path, "Test GenEval overall against k, M and tau (95% t-interval over "
                                            "seeds), one line per method"))
        sections.append(sec)
    sections += long_run(records, figures)
    summary = {}
    for rec in records:
        for m, e in rec["methods"].items():
            if rec["arm"] != "centre" and e.get("per_prompt") and (iv := score_interval(e["per_prompt"], OVERALL)):
                summary[f"{rec['name']}/{m}"] = iv.point
    return sections, claim4(records), summary

"""The ablation grid and the long run: the design, and the report's section and claim 4 judged
from fabricated records with known differences (scripts/ablation.py itself:
tests/test_ablation_script.py)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from margrpo.report import ablation
from margrpo.report.claims import FAILS, HOLDS, NO_DIFF, UNSURE, Claim
from margrpo.report.blocks import BLOCKS, block_stats
from margrpo.report.intervals import score_interval

ROOT = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
SEEDS = ("0", "1", "2")
TAGS = ("colors", "counting", "position")
PROMPTS = [{"prompt": f"{tag} prompt {i}", "tag": tag, "category": None, "subset": "test", "pool": None}
           for tag in TAGS for i in range(4)]
METHODS = {
    "grpo": {"freeze_head": False, "estimator": "single"},
    "grpo_frozen": {"freeze_head": True, "estimator": "single"},
    "mar_grpo": {"freeze_head": True, "estimator": "resample", "topk": True},
    "posterior": {"freeze_head": True, "estimator": "posterior", "topk": True},
    "grpo_frozen_spec": {"freeze_head": True, "estimator": "single", "token_scope": "committed+speculative",
                         "consistency": True},
}
CLAIMS = {"grpo": "grpo", "grpo_frozen": "grpo_frozen", "resample": "mar_grpo", "posterior": "posterior",
          "speculative": "grpo_frozen_spec"}
# the study's params.yaml as the grid reads it: knobs (the centre), methods and the claims' roles
PARAMS = {"k": 0.3, "tau": 0.0, "num_trajectories": 4, "methods": METHODS, "claims": CLAIMS}
SPEC = {"token_scope": "committed+speculative", "consistency": True}
ROLE_OF = {m: role for role, m in ablation.roles(PARAMS).items() if role in ablation.LONG_ROLES}


def _scores(shift: float = 0.0, per_seed: dict | None = None) -> dict:
    """Per-prompt scores of three seeds: a prompt pattern shared by every setting (so paired
    differences remove it), plus `shift`, plus a per-seed offset."""
    per_seed = per_seed or {}
    base = [0.3 + 0.4 * ((i * 7) % 5) / 5 for i in range(len(PROMPTS))]
    return {"prompts": PROMPTS, "images_per_prompt": 2,
            "final": {s: {"geneval": [v + shift + per_seed.get(s, 0.0) for v in base]} for s in SEEDS}}


def _record(name: str, arm: str, methods: dict, code: str = "c0", **knobs) -> dict:
    """methods: name -> (config overrides, per-prompt scores)."""
    return {"name": name, "arm": arm, "code": code, "commit": "e" * 40,
            "knobs": {"k": 0.3, "tau": 0.0, "num_trajectories": 4, "seeds": [0, 1, 2], **knobs},
            "methods": {m: {"role": ROLE_OF.get(m), "config": {**METHODS[m], **over}, "steps": 20,
                            "per_prompt": pp, "train_minutes": [4.0, 4.2, 4.4]}
                        for m, (over, pp) in methods.items()}}


def _grid_records() -> list[dict]:
    centre = _record("centre-c0", "centre", {"mar_grpo": ({}, _scores()), "posterior": ({}, _scores(0.05)),
                                             "grpo_frozen_spec": ({}, _scores(0.02))})
    return [
        centre,
        # k = 0.1 is worse by 0.2 on every prompt and seed; posterior worse by 0.1
        _record("abl-k0.1", "k", {"mar_grpo": ({}, _scores(-0.2)), "posterior": ({}, _scores(-0.05))}, k=0.1),
        # k = 0.5: within a few thousandths of the centre
        _record("abl-k0.5", "k", {"mar_grpo": ({}, _scores(0.0, {"0": 0.004, "1": -0.002, "2": 0.001})),
                                  "posterior": ({}, _scores(0.05))}, k=0.5),
        # tau arm (speculative tokens): tau = 0.5 better than tau = 0 by 0.1
        _record("abl-tau0", "tau", {"mar_grpo": (SPEC, _scores(0.1))}),
        _record("abl-tau0.5", "tau", {"mar_grpo": (SPEC, _scores(0.2)), "grpo_frozen_spec": ({}, _scores(-0.1))},
                tau=0.5),
        # another code fingerprint: never compared with the c0 points
        _record("abl-k1", "k", {"mar_grpo": ({}, _scores(0.5))}, code="c1", k=1.0),
    ]


# ---- design --------------------------------------------------------------------------------

def test_grid_is_one_factor_at_a_time_for_both_estimators():
    points = ablation.grid(PARAMS)
    by_arm = {arm: [p for p in points if p.arm == arm] for arm in ("k", "M", "tau", "long")}
    assert [p.value for p in by_arm["k"]] == [0.1, 0.5, 1.0]  # 0.3: the study itself
    assert [p.value for p in by_arm["M"]] == [2, 8]
    assert [p.value for p in by_arm["tau"]] == [-1.0, 0.0, 0.5]
    assert len(points) == 9 and len({p.name for p in points}) == 9
    assert all(p.methods == {"resample": "mar_grpo", "posterior": "posterior"} for p in points if p.arm != "long")
    tau = by_arm["tau"][0].overrides
    # keys a method block does not list are added with DVC's "+" (consistency makes a method read tau)
    assert tau[0] == "tau=-1" and "+methods.mar_grpo.token_scope=committed+speculative" in tau
    assert "+methods.posterior.consistency=true" in tau and not any("reads" in o for o in tau)
    long = by_arm["long"][0]
    assert set(long.overrides) == {f"+methods.{m}.steps_factor=10" for m in ("grpo", "grpo_frozen", "mar_grpo",
                                                                             "posterior")}


def test_grid_centre_is_the_studys_knobs():
    """The grid moves one knob away from params.yaml's values: a study at k = 0.5, M = 8 has
    no point at its own k or M, and the tau arm holds its tau."""
    points = ablation.grid({**PARAMS, "k": 0.5, "num_trajectories": 8, "tau": 0.25})
    values = {arm: [p.value for p in points if p.arm == arm] for arm in ("k", "M", "tau")}
    assert values == {"k": [0.1, 1.0], "M": [2], "tau": [-1.0, 0.25, 0.5]}
    # the knobs absent from a params tree are the schema's defaults
    assert [p.value for p in ablation.grid({"methods": METHODS, "claims": CLAIMS}) if p.arm == "k"] == [0.1, 0.5, 1.0]


def test_grid_names_the_missing_role():
    claims = {r: m for r, m in CLAIMS.items() if r != "posterior"}
    with pytest.raises(ValueError, match="params.yaml claims has no method for posterior"):
        ablation.grid({**PARAMS, "claims": claims})


# ---- the report section and claim 4 --------------------------------------------------------------

def test_paired_differences_and_verdicts_per_knob():
    records = _grid_records()
    k = {s.method: s for s in ablation.series(records, "k")}
    # the c1 record never joins the c0 series: k = 1.0 is absent
    assert set(k["mar_grpo"].points) == {0.1, 0.3, 0.5}
    assert k["mar_grpo"].centre == 0.3  # the centre record's k
    parts = dict(ablation.comparisons(k["mar_grpo"]))
    # a constant shift on every prompt and seed: the paired interval collapses onto it
    iv = parts[0.1].interval
    assert iv.point == pytest.approx(0.2) and iv.low == pytest.approx(0.2) and iv.high == pytest.approx(0.2)
    assert parts[0.1].status == HOLDS and parts[0.5].status == NO_DIFF
    tau = {s.method: s for s in ablation.series(records, "tau")}
    # speculative-token points compare among themselves, not with the committed-only centre
    assert set(tau["mar_grpo"].points) == {0.0, 0.5} and tau["mar_grpo"].points[0.0][0] == "abl-tau0"
    # grpo_frozen_spec at tau = 0.5 compares with the study's own grpo_frozen_spec (tau = 0)
    assert tau["grpo_frozen_spec"].points[0.0][0] == "centre-c0"
    assert dict(ablation.comparisons(tau["grpo_frozen_spec"]))[0.5].status == HOLDS


def test_the_centre_is_the_centre_records_knob():
    """Comparisons are against the knob value of the study the experiments started from (its
    centre record), whatever the grid's values."""
    centre = _record("centre-c0", "centre", {"mar_grpo": ({}, _scores())}, k=0.5)
    other = _record("abl-k0.3", "k", {"mar_grpo": ({}, _scores(-0.2))}, k=0.3)
    (s,) = ablation.series([centre, other], "k")
    assert s.centre == 0.5 and [p.text for _, p in ablation.comparisons(s)] == [
        "GenEval overall, k=0.5 − k=0.3 (mar_grpo (resample))"]
    assert "not yet run: k=0.1, k=1, tau=-1, tau=0, tau=0.5" in ablation.claim4([centre, other]).note


def test_claim4_is_judged_on_resample_with_posterior_in_the_note():
    c4 = ablation.claim4(_grid_records())
    texts = [p.text for p in c4.parts]
    assert texts == ["GenEval overall, k=0.3 − k=0.1 (mar_grpo (resample))",
                     "GenEval overall, k=0.3 − k=0.5 (mar_grpo (resample))",
                     "GenEval overall, tau=0 − tau=0.5 (mar_grpo (resample))"]
    assert [p.status for p in c4.parts] == [HOLDS, NO_DIFF, FAILS]
    assert c4.status == FAILS  # tau = 0.5 beats tau = 0
    assert "posterior estimator by the same rule: holds" in c4.note
    assert "not yet run: k=1, tau=-1" in c4.note


def test_claim4_no_difference_and_inconclusive():
    centre = _record("centre-c0", "centre", {"mar_grpo": ({}, _scores())})
    near = _record("abl-k0.5", "k", {"mar_grpo": ({}, _scores(0.0, {"0": 0.004, "1": -0.002, "2": 0.001}))}, k=0.5)
    assert ablation.claim4([centre, near]).status == NO_DIFF
    noisy = _record("abl-k0.1", "k", {"mar_grpo": ({}, _scores(0.0, {"0": 0.06, "1": -0.05, "2": 0.01}))}, k=0.1)
    c4 = ablation.claim4([centre, near, noisy])
    assert c4.status == UNSURE
    # centre − k=0.1: d = −0.007, t-interval over the 3 seeds ±4.303 se
    assert c4.parts[0].render().endswith("d -0.007 [-0.143, +0.130] (inconclusive)") and c4.parts[0].key == "k=0.1"
    assert ablation.claim4([centre]) is None  # nothing to compare: not judged


def test_k0_is_the_centre_studys_grpo_frozen(tmp_path):
    """k = 0 scores no token with several chains: the k series of each estimator starts at
    grpo_frozen of the centre study with the same code (not at another code's, and not in
    the single-chain grpo_frozen_spec's series)."""
    records = _grid_records()
    records[0]["methods"]["grpo_frozen"] = {"role": "grpo_frozen", "config": METHODS["grpo_frozen"], "steps": 20,
                                            "per_prompt": _scores(0.1), "train_minutes": [2.0, 2.0, 2.0]}
    k = {s.method: s for s in ablation.series(records, "k")}
    assert set(k["mar_grpo"].points) == {0.0, 0.1, 0.3, 0.5} and set(k["posterior"].points) == {0.0, 0.1, 0.3, 0.5}
    assert k["mar_grpo"].points[0.0][0::2] == ("centre-c0", "grpo_frozen")
    assert "grpo_frozen_spec" not in k and "grpo_frozen" not in k
    part = dict(ablation.comparisons(k["mar_grpo"]))[0.0]
    assert part.text == "GenEval overall, k=0.3 − k=0 (grpo_frozen) (mar_grpo (resample))"
    assert part.interval.point == pytest.approx(-0.1) and part.status == FAILS  # k = 0 is better by 0.1
    assert ablation.claim4(records).status == FAILS
    (sec,), _, _ = ablation.section(records, tmp_path)
    row = next(r for r in sec.tables[0].rows if r[1] == "0" and "mar_grpo" in r[2])
    assert row[2] == "grpo_frozen (k = 0 of mar_grpo (resample))" and row[6] == "2.0"
    assert "above the centre" in row[5]


def test_section_table_figure_and_summary(tmp_path):
    (sec,), c4, summary = ablation.section(_grid_records(), tmp_path)
    assert c4 is not None and sec.anchor == "ablation"
    rows = {(r[0].split()[0], r[1], r[2]): r for r in sec.tables[0].rows}
    k01 = rows[("k", "0.1", "mar_grpo (resample)")]
    # the table reads this − centre: −0.2, below the centre
    assert k01[5].startswith("-0.200 [-0.200, -0.200]") and "below the centre" in k01[5]
    assert rows[("k", "0.3", "mar_grpo (resample)")][5] == "centre"
    assert "within ±0.03 of the centre" in rows[("k", "0.5", "mar_grpo (resample)")][5]
    assert (tmp_path / "ablation_knobs.png").stat().st_size > 0
    assert summary["abl-k0.1/mar_grpo"] == pytest.approx(score_interval(_scores(-0.2), ablation.OVERALL).point)
    assert not any(k.startswith("centre") for k in summary)
    assert ablation.section([], tmp_path) == ([], None, {})


def test_long_run_curves_and_claims_1_2(tmp_path):
    def hist(kl_slope: float, seed: int) -> list[dict]:
        return [{"step": t, "loss/kl": 0.01 + kl_slope * t + 0.001 * seed, "diag/grad_norm_ar": 0.1 + kl_slope * t,
                 "reward/mean": 0.5, "judge/correct": 0.3, "time/step": 6.0} for t in range(1, 41)]

    methods = {}
    for m, slope, shift in (("grpo", 0.002, 0.0), ("grpo_frozen", 0.0, 0.05), ("mar_grpo", 0.0, 0.05),
                            ("posterior", 0.0, 0.1)):
        methods[m] = {"role": ROLE_OF[m], "config": {**METHODS[m], "steps_factor": 10}, "steps": 40,
                      "per_prompt": _scores(shift), "train_minutes": [4.0],
                      "history": {s: hist(slope, int(s)) for s in SEEDS},
                      "evals": {s: [{"step": 0, "eval/geneval/overall": 0.3}, {"step": 40, "eval/geneval/overall": 0.4}]
                                for s in SEEDS}}
    long = {"name": "long-x10", "arm": "long", "code": "c0", "commit": "f" * 40,
            "knobs": {"k": 0.3, "tau": 0.0, "num_trajectories": 4, "seeds": [0, 1, 2]}, "methods": methods}
    (sec,) = ablation.long_run([long], tmp_path)
    assert sec.figures and sec.figures[0].path.stat().st_size > 0
    assert [r[1] for r in sec.tables[0].rows] == ["40"] * 4
    verdicts = {row[0]: row[1] for row in sec.tables[1].rows}
    assert verdicts["GenEval overall, grpo − grpo_frozen"] == FAILS  # grpo is 0.05 below on every prompt
    assert verdicts["GenEval overall, posterior − mar_grpo"] == HOLDS
    # every method trains 10x: still compared (equal budgets), KL grows for grpo only
    claim1 = next(v for k, v in verdicts.items() if k.startswith("claim 1"))
    claim2 = next(v for k, v in verdicts.items() if k.startswith("claim 2"))
    assert claim1 == HOLDS and claim2 == HOLDS


def _one_seed_long(kl_slope_grpo: float) -> dict:
    """A 200-step long run on seed 0: grpo's KL and AR grad norm change by kl_slope_grpo per
    step, the frozen methods' stay flat; every curve has seeded Gaussian step noise."""
    rng = random.Random(0)

    def hist(slope: float, steps: int = 200) -> list[dict]:
        return [{"step": t, "loss/kl": 0.02 + slope * t + rng.gauss(0, 0.002),
                 "diag/grad_norm_ar": 0.1 + slope * t + rng.gauss(0, 0.002), "reward/mean": 0.5 + rng.gauss(0, 0.01)}
                for t in range(1, steps + 1)]

    methods = {m: {"role": ROLE_OF.get(m), "config": {**METHODS[m], "steps_factor": 10}, "steps": 200,
                   "history": {"0": hist(kl_slope_grpo if m == "grpo" else 0.0)}}
               for m in ("grpo", "grpo_frozen", "mar_grpo", "posterior")}
    # retrained at the study's budget because the seeds changed: no role, not in claims 1-2
    methods["grpo_frozen_spec"] = {"role": None, "config": METHODS["grpo_frozen_spec"], "steps": 20,
                                   "history": {"0": hist(0.05, 20)}}
    return {"name": "long-x10", "arm": "long", "code": "c0", "commit": "f" * 40,
            "knobs": {"k": 0.3, "tau": 0.0, "num_trajectories": 4, "seeds": [0]}, "methods": methods}


def test_block_stats_replace_seeds_within_one_run():
    hist = [{"step": t, "loss/kl": float(t), "reward/mean": 1.0 if t == 7 else 0.0, "probe/snr": 1.0}
            for t in range(1, 213)]
    stats = block_stats(hist)
    # 212 steps: 53-step windows, 5 blocks of 10; the final window keeps the run's last 50 steps
    # (163-212), the early one its first 50 (1-50)
    assert BLOCKS == 5 and stats["final"]["loss/kl"] == pytest.approx([167.5, 177.5, 187.5, 197.5, 207.5])
    assert stats["growth"]["loss/kl"] == pytest.approx([162.0] * 5)
    assert stats["final"]["reward/peak_drop"] == [pytest.approx(1.0)]  # peak 1 at step 7, 0 at the end
    assert "probe/snr" not in stats["final"]  # sparse keys are not blocked
    assert block_stats(hist[:4]) == {"final": {}, "growth": {}}  # fewer steps than blocks: no replicates


@pytest.mark.parametrize("slope, verdict", [(0.001, HOLDS), (0.0, UNSURE), (-0.0001, FAILS)])
def test_one_seed_long_run_judges_claims_1_2_on_blocks(slope, verdict):
    """grpo's KL rising 0.15 over the run holds; flat curves (noise only) stay inconclusive;
    KL falling 0.015 does not hold (claim 1), nor does grpo above the frozen head (claim 2)."""
    rec = _one_seed_long(slope)
    claims, one_seed = ablation.long_claims(rec)
    claims = {c.number: c for c in claims}
    assert one_seed and claims[1].status == verdict and claims[2].status == verdict
    assert all(p.se > 0 for c in claims.values() for p in c.parts)  # the blocks' spread, not a cancelled zero
    # the frozen single-chain method is grpo_frozen (grpo_frozen_spec has no long-run role)
    assert all("grpo_frozen_spec" not in p.text for p in claims[2].parts)
    assert all("power" not in p.render() for c in claims.values() for p in c.parts)  # no design: no power claimed
    study = [Claim(1, "c1", note="study note"), Claim(2, "c2")]
    ablation.note_long_verdicts(study, [rec])
    assert study[0].note == (f"study note; long run long-x10 (200 steps, seed 0, replicates: 5 blocks of one run): "
                             f"{verdict} (report section 'Long run: long-x10')")
    assert study[1].note.startswith("long run long-x10")


def test_one_seed_is_decided_on_the_long_runs_own_methods():
    rec = _one_seed_long(0.001)
    rec["methods"]["grpo_frozen_spec"]["history"] = {}  # a method without a role or history changes nothing
    assert ablation.long_claims(rec)[1] is True
    rec["methods"]["grpo"]["history"]["1"] = rec["methods"]["grpo"]["history"]["0"]
    claims, one_seed = ablation.long_claims(rec)
    assert not one_seed  # two seeds somewhere: the seed rule, which needs two seeds per group
    # claim 2 compares grpo's two seeds with grpo_frozen's one: no standard error
    assert claims[1].number == 2 and claims[1].parts[0].render().endswith("one seed (inconclusive)")


# ---- collection from DVC experiment refs -----------------------------------------------------------

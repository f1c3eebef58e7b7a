"""Claim verdicts of the report (method.md §6) from per-seed numbers."""
from __future__ import annotations

import math

import pytest

from margrpo.report.claims import (DELTA, FAILS, HOLDS, NO_DIFF, RULE, STATUS_CODE, UNSURE, Claim, Part, build_claims,
                                   compare, compare_stats, interval_verdict, one_sample)
from margrpo.report import inference as inf
from margrpo.report.intervals import Interval

METHODS = {
    "grpo": {"freeze_head": False, "estimator": "single"},
    "grpo_frozen": {"freeze_head": True, "estimator": "single"},
    "mar_grpo": {"freeze_head": True, "estimator": "resample"},
}
# params.yaml `claims`: which method plays which role
ROLES = {"grpo": "grpo", "grpo_frozen": "grpo_frozen", "resample": "mar_grpo"}


def _train(kl: list[float], reward: list[float]) -> dict:
    return {"final": {"loss/kl": kl, "reward/mean": reward, "probe/var_ratio_vs_single": [0.8, 0.9, 0.85]},
            "growth": {"loss/kl": kl, "diag/grad_norm_ar": [0.0, 0.1, -0.1]}}


def test_compare_uses_paired_t_tests():
    assert compare("x", [1.0, 1.1, 0.9], [0.0, 0.1, -0.1]).status == HOLDS
    # d = −1 beyond −delta: does not hold; with a margin of 2 the same d is not a refutation
    assert compare("x", [0.0, 0.1, -0.1], [1.0, 1.1, 0.9]).status == FAILS
    assert compare("x", [0.0, 0.1, -0.1], [1.0, 1.1, 0.9], delta=2.0).status == NO_DIFF
    assert compare("x", [0.0, 0.5, -0.5], [0.1, 0.6, -0.4]).status == FAILS  # paired: exactly −0.1 each seed
    assert compare("x", [0.0, 0.5, -0.5], [0.1, 0.7, -0.4]).status == UNSURE
    assert compare("x", [1.0], [0.0]).status == UNSURE  # one seed: no standard error
    assert compare("x", [1.0, 1.1, 0.9, 1.0], [0.0, 0.1, -0.1]).df == 5  # unequal seeds: two-sample, pooled


def test_mte_claim_compares_against_the_frozen_head_single_method():
    train = {"grpo": _train([0.05, 0.06, 0.07], [0.9, 0.91, 0.92]),
             "grpo_frozen": _train([0.01, 0.02, 0.03], [0.5, 0.51, 0.52]),
             "mar_grpo": _train([0.01, 0.02, 0.03], [0.6, 0.61, 0.62])}
    claims = {c.number: c for c in build_claims(train, {}, METHODS, ROLES, {})}
    # Claim 2 picks the frozen single-chain method (no MTE confound) and has no confound note.
    assert all("grpo_frozen" in p.text for p in claims[2].parts) and not claims[2].note
    assert claims[2].parts[0].status == HOLDS  # its final KL is lower than grpo's
    # Claim 3's reward part is against grpo_frozen (mar_grpo higher: holds), not grpo (lower).
    reward = next(p for p in claims[3].parts if "final reward" in p.text)
    assert reward.text.endswith("grpo_frozen") and reward.status == HOLDS
    assert "freezes the head too" in claims[3].note


def test_without_a_frozen_single_method_the_confound_is_named():
    methods = {k: v for k, v in METHODS.items() if k != "grpo_frozen"}
    roles = {r: m for r, m in ROLES.items() if r != "grpo_frozen"}
    train = {"grpo": _train([0.05, 0.06, 0.07], [0.9, 0.91, 0.92]),
             "mar_grpo": _train([0.01, 0.02, 0.03], [0.6, 0.61, 0.62])}
    claims = {c.number: c for c in build_claims(train, {}, methods, roles, {})}
    assert "confounded" in claims[2].note
    reward = next(p for p in claims[3].parts if "final reward" in p.text)
    assert reward.text.endswith("− grpo") and reward.status == FAILS


@pytest.mark.parametrize("budget", [{"steps_factor": 3}, {"batch_factor": 2}, {"lr_schedule": "cosine"},
                                    {"warmup_frac": 0.25}])
def test_a_method_trained_on_another_budget_is_left_out_of_the_claims(budget):
    # a role names it: without the equal-budget rule claims 2 and 3 would compare it
    methods = {"grpo_frozen_long": {"freeze_head": True, "estimator": "single", **budget}, **METHODS}
    train = {"grpo": _train([0.05, 0.06, 0.07], [0.9, 0.91, 0.92]),
             "grpo_frozen_long": _train([0.01, 0.02, 0.03], [0.9, 0.91, 0.92]),
             "grpo_frozen": _train([0.01, 0.02, 0.03], [0.5, 0.51, 0.52]),
             "mar_grpo": _train([0.01, 0.02, 0.03], [0.6, 0.61, 0.62])}
    claims = build_claims(train, {}, methods, {**ROLES, "grpo_frozen": "grpo_frozen_long"}, {})
    texts = [p.text for c in claims for p in c.parts]
    assert texts and not [t for t in texts if "grpo_frozen_long" in t]
    assert "confounded" in claims[1].note  # claim 2 falls back on the MTE method


# ---- the interval rule for score parts (per-prompt scores) -----------------------------

PROMPTS = [{"prompt": f"p{i}", "tag": tag, "category": cat, "subset": "test"}
           for i, (tag, cat) in enumerate([("colors", "color"), ("colors", "color"), ("position", "spatial"),
                                           ("position", "spatial"), ("counting", "complex"), ("counting", "complex")])]


def _per_prompt(level: float, seeds=("0", "1", "2"), spread: float = 0.2, jitter: float = 0.0) -> dict:
    """Per-prompt scores: level + a prompt effect (+-spread) + a seed effect, the same for
    every target (so paired differences are the level differences), + a target's own
    +-jitter that averages to 0 within each tag (a paired difference that varies by prompt)."""
    def vals(s):
        return [level + (spread if i % 2 else -spread) + 0.01 * int(s) + (jitter if i in (0, 3, 4) else -jitter)
                for i in range(len(PROMPTS))]

    final = {s: {"geneval": vals(s), "t2i": vals(s), "proxy_geneval": vals(s), "proxy_t2i": vals(s)} for s in seeds}
    return {"images_per_prompt": 2, "prompts": PROMPTS, "final": final, "best": {}}


def _iv(low: float, high: float, **kw) -> Interval:
    return Interval(point=(low + high) / 2, low=low, high=high, seeds=3, prompts=6, **kw)


def test_one_seed_interval_is_inconclusive_whatever_its_width():
    # the whole test split as the prompts: one seed's interval has no width, and no seed spread
    assert interval_verdict(Interval(0.04, 0.04, 0.04, 1, 70)) == UNSURE
    assert interval_verdict(Interval(0.04, 0.04, 0.04, 2, 70)) == HOLDS


def test_interval_verdicts_and_the_no_difference_band():
    assert interval_verdict(_iv(0.01, 0.05)) == HOLDS
    assert interval_verdict(_iv(-0.05, -0.031)) == FAILS
    assert interval_verdict(_iv(-0.05, -0.001)) == UNSURE  # below 0 but not below −delta: no refutation
    assert interval_verdict(_iv(-0.029, -0.001)) == NO_DIFF  # within ±delta is tested before "below"
    assert interval_verdict(_iv(-0.02, 0.029)) == NO_DIFF
    assert interval_verdict(_iv(-0.02, 0.031)) == UNSURE  # reaches past +delta
    assert interval_verdict(_iv(0.001, 0.02)) == HOLDS  # above 0 takes precedence over the band
    assert DELTA == 0.03 and "study_design.yaml" in RULE and "no difference larger than δ" in RULE
    assert STATUS_CODE == {HOLDS: 1, UNSURE: 0, FAILS: -1, NO_DIFF: 2}


def test_claim_status_combines_score_and_training_parts():
    def claim(*parts):
        return Claim(0, "x", list(parts))

    def part(d, se, score=False, delta=0.03):
        return Part("p", d, se, score=score, df=10.0, delta=delta).judge()

    nodiff, unsure = part(0.0, 0.005, score=True), part(0.0, 0.05, score=True)
    held, failed = part(1.0, 0.1), part(-1.0, 0.1)
    assert claim(nodiff, nodiff, held).status == NO_DIFF  # every score part within ±delta
    assert claim(nodiff, unsure, held).status == UNSURE
    assert claim(nodiff, failed).status == FAILS  # a part that does not hold, after Holm
    assert claim(held, part(0.1, 0.01, score=True)).status == HOLDS
    assert claim(held, part(0.0, 0.1)).status == UNSURE  # no score part: never "no difference"
    # p(does not hold) 0.02 alone refutes; Holm over two parts (0.04 > 0.025) does not
    edge = part(-0.03 - 0.1 * float(inf.st.t.isf(0.02, 10)), 0.1)
    assert edge.status == FAILS and claim(edge, held).status == UNSURE
    assert claim(edge, held).part_statuses() == [UNSURE, HOLDS]


def test_part_render_shows_the_interval_and_the_design_power():
    iv = Interval(0.031, -0.004, 0.066, 3, 40, se=0.0081, df=2.0)
    unsure = Part("GenEval overall, a − b", 0.031, 0.0081, UNSURE, score=True, interval=iv, df=2.0,
                  power=0.12, effect=0.05)
    # the bounds come from d, se and df: 0.031 ± 4.303 · 0.0081
    assert unsure.render() == "GenEval overall, a − b: d +0.031 [-0.004, +0.066] (inconclusive; power 12% at +0.05)"
    assert "one seed" in Part("x", 0.031, math.nan, UNSURE).render()
    assert Part("x").render() == "x: not measured"


def test_score_parts_use_the_paired_interval_where_per_prompt_scores_exist():
    train = {"grpo": _train([0.05, 0.06, 0.07], [0.9, 0.91, 0.92]),
             "grpo_frozen": _train([0.01, 0.02, 0.03], [0.5, 0.51, 0.52]),
             "mar_grpo": _train([0.01, 0.02, 0.03], [0.6, 0.61, 0.62])}
    # Seed-level scores say nothing (huge spread); the per-prompt scores pair exactly.
    spread = {"base": [0.0, 1.0, 0.5], "grpo": [1.0, 0.5, 0.0], "grpo_frozen": [0.5, 0.0, 1.0],
              "mar_grpo": [0.0, 0.5, 1.0]}
    evals = {t: {"eval/geneval/overall": v, "eval/t2i/mean": v} for t, v in spread.items()}
    per_prompt = {"base": _per_prompt(0.3), "grpo": _per_prompt(0.5), "grpo_frozen": _per_prompt(0.4, jitter=0.02),
                  "mar_grpo": _per_prompt(0.4)}
    claims = {c.number: c for c in build_claims(train, evals, METHODS, ROLES, {}, per_prompt)}
    c3 = {p.text: p for p in claims[3].parts}
    geneval = c3["GenEval overall, mar_grpo − grpo_frozen"]
    assert geneval.interval is not None and geneval.d == pytest.approx(0.0, abs=1e-12)
    # the prompt jitter averages out within each tag: the same statistic every seed, a point interval
    assert -DELTA < geneval.interval.low <= 0 <= geneval.interval.high < DELTA and geneval.status == NO_DIFF
    assert c3["final reward, mar_grpo − grpo_frozen"].interval is None  # a training part: the seed rule
    assert claims[3].status == NO_DIFF  # its score parts are within ±delta; the others hold
    c5 = {p.text: p.status for p in claims[5].parts}
    assert c5["geneval/overall, mar_grpo − base"] == HOLDS and c5["geneval/overall, mar_grpo − grpo"] == FAILS
    assert c5["geneval/position, mar_grpo − base"] == HOLDS and claims[5].status == FAILS
    # control: without per-prompt scores the same comparisons fall back to the seed rule
    fallback = {c.number: c for c in build_claims(train, evals, METHODS, ROLES, {})}
    geneval = next(p for p in fallback[3].parts if p.text.startswith("GenEval"))
    assert geneval.interval is None and geneval.status == UNSURE and geneval.score
    # a target without per_prompt.json (here grpo) uses the seed rule for its comparisons only
    partial = {c.number: c for c in build_claims(train, evals, METHODS, ROLES, {}, {**per_prompt, "grpo": None})}
    c5 = {p.text: p for p in partial[5].parts}
    assert c5["geneval/overall, mar_grpo − grpo"].interval is None
    assert c5["geneval/overall, mar_grpo − base"].interval is not None


def test_score_parts_pair_on_the_common_seeds():
    per_prompt = {"grpo_frozen": _per_prompt(0.3, seeds=("0", "1")), "mar_grpo": _per_prompt(0.4)}
    claims = {c.number: c for c in build_claims({}, {}, METHODS, ROLES, {}, per_prompt)}
    part = next(p for p in claims[3].parts if p.text.startswith("GenEval"))
    assert part.interval.seeds == 2 and part.d == pytest.approx(0.1) and part.status == HOLDS


def test_seed_rule_parts_by_hand():
    # d = 0.1 every seed: se 0 -> holds; one_sample of [0.1, -0.05, 0.04]: d 0.03, sd 0.0755, se 0.04359, df 2
    assert compare("x", [0.2, 0.3, 0.1], [0.1, 0.2, 0.0]).status == HOLDS
    one = one_sample("growth", [0.1, -0.05, 0.04])
    assert (one.d, one.se, one.df) == pytest.approx((0.03, 0.04359, 2.0), abs=1e-4) and one.status == UNSURE
    # Welch from summary statistics: se sqrt(0.01/3 + 0.01/3) = 0.08165, df 4
    stats = compare_stats("x", (0.3, 0.1, 3), (0.0, 0.1, 3))
    assert (stats.se, stats.df) == pytest.approx((0.08165, 4.0), abs=1e-4) and stats.status == HOLDS
    assert compare_stats("x", (math.nan, 0.1, 3), (0.0, 0.1, 3)).status == UNSURE



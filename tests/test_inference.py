"""The statistics behind the verdicts (report/inference.py), against hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from margrpo.report import inference as inf
from margrpo.report.inference import FAILS, HOLDS, NO_DIFF, UNSURE

# grpo − base per seed in the committed study (GenEval overall, seeds 0-2)
GAINS = [0.057, 0.001, 0.081]


def test_paired_t_interval_by_hand():
    # mean 0.046333; sum of squares 0.0033707 -> var 0.0016853, se sqrt(var / 3) = 0.023702;
    # t_0.975(2) = 4.302653 -> half-width 0.10198
    est = inf.one_sample(GAINS)
    assert float(est.d) == pytest.approx(0.0463333, abs=1e-6)
    assert float(est.se) == pytest.approx(0.023702, abs=1e-6) and float(est.df) == 2
    low, high = est.interval()
    assert (float(low), float(high)) == pytest.approx((-0.05565, 0.14832), abs=1e-4)
    pair = inf.paired([0.368, 0.255, 0.275], [0.311, 0.254, 0.194])  # the same gains from the two arms
    assert float(pair.d) == pytest.approx(est.d) and pair.kind == "paired"


def test_one_seed_has_no_interval():
    est = inf.one_sample([0.05])
    assert math.isnan(float(est.se)) and str(inf.verdict(*vars(inf.part_tests(est, 0.03)).values())) == UNSURE


def test_pooled_and_welch_by_hand():
    a, b = [1.0, 2.0, 3.0], [2.0, 4.0, 6.0]  # means 2, 4; variances 1, 4
    pooled = inf.two_sample(a, b, pooled=True)
    # pooled variance (2·1 + 2·4) / 4 = 2.5; se sqrt(2.5 · 2/3) = 1.290994; df 4
    assert (float(pooled.d), float(pooled.se), float(pooled.df)) == pytest.approx((-2.0, 1.290994, 4.0), abs=1e-6)
    welch = inf.two_sample(a, b, pooled=False)
    # se sqrt(1/3 + 4/3) (equal n: the same); df (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17
    assert (float(welch.se), float(welch.df)) == pytest.approx((1.290994, 50 / 17), abs=1e-6)
    # F = 1/4 on (2, 2) df: two-sided p = 0.4, the variances agree and the pooled test is used
    assert bool(inf.variances_agree(a, b)) and inf.two_sample(a, b).kind == "pooled"
    assert not bool(inf.variances_agree([0.0, 0.01, 0.02, 0.0, 0.01], [0.0, 5.0, -5.0, 3.0, -3.0]))


def test_holm_by_hand():
    # sorted 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> running max 0.03, 0.06, 0.06
    assert inf.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert inf.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # 0.5·2 = 1.0 carries to the larger one
    batch = inf.holm(np.array([[0.01, 0.04, 0.03], [0.2, 0.001, 0.02]]))
    assert batch[1] == pytest.approx([0.2, 0.003, 0.04])


def _tests(d: float, se: float, df: float = 10.0, delta: float = 0.03) -> inf.Tests:
    return inf.part_tests(inf.Estimate(np.array(d), np.array(se), np.array(df), 11, "paired"), delta)


def test_part_verdicts_read_off_the_95_interval():
    t = inf.Estimate(np.array(0.0), np.array(1.0), np.array(10.0), 11, "paired")
    crit = float(inf.st.t.ppf(0.975, 10))  # 2.228: the 95% interval's half-width in se
    assert float(t.p_greater(-crit)) == pytest.approx(0.025)
    assert str(inf.verdict(*vars(_tests(0.030, 0.013)).values())) == HOLDS       # low 0.001 > 0
    assert str(inf.verdict(*vars(_tests(0.028, 0.013)).values())) == UNSURE      # low −0.001
    assert str(inf.verdict(*vars(_tests(-0.060, 0.013)).values())) == FAILS     # high −0.031 < −delta
    # the example: k = 0.3 − k = 0.1 = −0.024, inside delta: never "does not hold"
    assert str(inf.verdict(*vars(_tests(-0.024, 0.001)).values())) == NO_DIFF
    assert str(inf.verdict(*vars(_tests(-0.024, 0.013)).values())) == UNSURE
    assert str(inf.verdict(*vars(_tests(0.01, 0.004)).values())) == HOLDS       # in (0, delta): holds wins


def test_claim_verdict_holm_on_does_not_hold_and_intersection_on_holds():
    ok, worse, flat = _tests(0.05, 0.01), _tests(-0.062, 0.013), _tests(0.0, 0.005)
    # p(fails) of `worse` is about 0.024: enough alone, not with a second part under Holm (0.048)
    assert str(inf.part_verdicts([worse])[0]) == FAILS
    assert str(inf.claim_verdict([worse, ok])) == UNSURE
    assert str(inf.claim_verdict([ok, ok])) == HOLDS
    assert str(inf.claim_verdict([ok, flat])) == UNSURE
    assert str(inf.claim_verdict([flat, flat, ok], score=[True, True, False])) == NO_DIFF
    assert str(inf.claim_verdict([_tests(-0.2, 0.01), ok])) == FAILS
    # best: every other worse or within ±delta and one worse by Holm
    assert str(inf.claim_verdict([ok, flat], best=True)) == HOLDS
    assert str(inf.claim_verdict([flat, flat], best=True)) == NO_DIFF
    assert str(inf.claim_verdict([_tests(-0.024, 0.013), ok], best=True)) == UNSURE


def test_power_matches_its_normal_approximation_and_a_simulation():
    # large n: power ≈ Φ(effect·sqrt(n)/sd − z_0.975); n = 400, effect/sd = 0.1 -> Φ(0.04) = 0.516
    assert float(inf.power(0.1, 1.0, 400)) == pytest.approx(0.516, abs=0.01)
    # seeds for 80%: the normal formula ((z_0.975 + z_0.8) sd / effect)^2 = 40.3 at sd 0.068, effect 0.03;
    # the t test needs a few more
    n = inf.seeds_for_power(0.03, 0.068)
    assert 41 <= n <= 44
    assert float(inf.power(0.03, 0.068, n)) >= 0.8 > float(inf.power(0.03, 0.068, n - 1))
    rng = np.random.default_rng(0)
    x = rng.normal(0.03, 0.068, (20000, 12))
    rate = float((inf.one_sample(x).p_greater(0.0) <= inf.ALPHA).mean())
    assert rate == pytest.approx(float(inf.power(0.03, 0.068, 12)), abs=0.015)
    assert inf.seeds_for_power(0.0, 0.068) is None


def test_pooled_power_and_tost_power():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.04, 0.05, (20000, 8)), rng.normal(0.0, 0.05, (20000, 8))
    rate = float((inf.two_sample(a, b, pooled=True).p_greater(0.0) <= inf.ALPHA).mean())
    assert rate == pytest.approx(float(inf.power(0.04, 0.05, 8, design="pooled")), abs=0.015)
    x = rng.normal(0.0, 0.03, (20000, 20))
    tost = inf.part_tests(inf.one_sample(x), 0.03).equiv
    bound = float(inf.tost_power(0.0, 0.03, 20, 0.03))
    assert 0 < bound <= float((tost <= inf.ALPHA).mean()) + 0.01


def test_nested_components():
    assert inf.seed_var(0.035, 0.033) == pytest.approx(0.035 ** 2 + 0.033 ** 2)
    assert inf.seed_var(0.035, 0.033, eval_scale=4) == pytest.approx(0.035 ** 2 + 0.033 ** 2 / 4)
    # two trained arms, independent evaluation noise: 2 (sigma_T^2 + sigma_E^2)
    assert inf.diff_sd((0.035, 0.035), 0.033) == pytest.approx(math.sqrt(2 * (0.035 ** 2 + 0.033 ** 2)))
    # against the base (no training noise), evaluation noise half shared
    assert inf.diff_sd((0.035, 0.0), 0.033, rho_e=0.5) == pytest.approx(math.sqrt(0.035 ** 2 + 0.033 ** 2))
    parts = [(0.05, 0.068, "paired")] * 2
    assert float(inf.claim_power(parts, 20)) == pytest.approx(float(inf.power(0.05, 0.068, 20)) ** 2)
    n = inf.seeds_for_claim(parts)
    assert float(inf.claim_power(parts, n)) >= 0.8 > float(inf.claim_power(parts, n - 1))

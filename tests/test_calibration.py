"""Calibration of the report's intervals and verdicts on simulated studies with known effects.

Each simulated study draws per-seed scores from the nested model of report/inference.py with
the pilot's variance components (study_design.yaml; for GenEval overall sigma_t about 0.03
between trained seeds and sigma_e about 0.037 evaluation noise, the committed study's) at the
committed study's 3 seeds, and runs them through the report's own functions:

    score(arm, seed) = mu_arm + T(arm, seed) + E(arm, seed),  T ~ N(0, sigma_t^2) (0 for the base),
    E = sigma_e (sqrt(rho_e) Z_seed + sqrt(1 − rho_e) Z_arm,seed)   (rho_e: shared image seeds)

The 95% intervals must cover the true difference 93-97% of the time, null or not, and under a
null of no difference every claim of the design must read a wrong "holds" or "does not hold"
at most 5% of the time. Controls show the checks can fail: the min-max interval of three seeds
(the old percentile bootstrap's) covers about 75%, and the old claim rule (any part's interval
below 0, no Holm, no margin) refutes the ten-part claim 5 far more often than 5%.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from margrpo.report import design as study_design
from margrpo.report import inference as inf

ROOT = Path(__file__).resolve().parents[1]
DESIGN = study_design.read(ROOT / study_design.DESIGN_FILE)
STUDIES, SEEDS = 10_000, 3  # simulated studies per check; seeds per method as in the committed study
COVER = (0.93, 0.97)
OVERALL = DESIGN.pilot["eval/geneval/overall"]


def _arms(rng, n_arms: int, sigma_t, sigma_e: float, rho_e: float = 0.0, studies: int = STUDIES,
          seeds: int = SEEDS) -> np.ndarray:
    """Per-seed scores [studies, arms, seeds] with mean 0; sigma_t per arm (0 for the base)."""
    sigma_t = np.broadcast_to(np.asarray(sigma_t, dtype=float), (n_arms,))[None, :, None]
    shared = rng.normal(size=(studies, 1, seeds)) * np.sqrt(rho_e)
    own = rng.normal(size=(studies, n_arms, seeds)) * np.sqrt(1 - rho_e)
    return sigma_t * rng.normal(size=(studies, n_arms, seeds)) + sigma_e * (shared + own)


def _coverage(est: inf.Estimate, truth: float) -> float:
    low, high = est.interval()
    return float(((low <= truth) & (truth <= high)).mean())


@pytest.mark.parametrize("effect", [0.0, 0.05])
@pytest.mark.parametrize("rho_e", [0.0, 0.5])
def test_paired_intervals_cover(effect, rho_e):
    rng = np.random.default_rng(7)
    c = OVERALL
    y = _arms(rng, 3, [c.sigma_t, c.sigma_t, 0.0], c.sigma_e, rho_e)  # two trained methods and the base
    y[:, 0] += effect
    assert COVER[0] <= _coverage(inf.paired(y[:, 0], y[:, 2]), effect) <= COVER[1]   # method − base
    assert COVER[0] <= _coverage(inf.paired(y[:, 0], y[:, 1]), effect) <= COVER[1]   # method − method
    assert COVER[0] <= _coverage(inf.one_sample(y[:, 0] + 1.0), effect + 1.0) <= COVER[1]  # a score itself


@pytest.mark.parametrize("effect", [0.0, 0.05])
def test_two_sample_intervals_cover(effect):
    # arms on independent seeds: pooled where the F test finds the variances equal, else Welch
    rng = np.random.default_rng(8)
    c = OVERALL
    y = _arms(rng, 3, [c.sigma_t, c.sigma_t, 0.0], c.sigma_e)
    y[:, 0] += effect
    assert COVER[0] <= _coverage(inf.two_sample(y[:, 0], y[:, 1]), effect) <= COVER[1]
    assert COVER[0] <= _coverage(inf.two_sample(y[:, 0], y[:, 2]), effect) <= COVER[1]
    y6 = _arms(rng, 2, [c.sigma_t, 0.0], 3 * c.sigma_e, seeds=6)  # unequal variances, more seeds
    assert COVER[0] <= _coverage(inf.two_sample(y6[:, 0], y6[:, 1], pooled=False), 0.0) <= COVER[1]


def test_the_min_max_interval_of_three_seeds_fails_the_check():
    """Control: the old percentile bootstrap at 3 seeds spans about min to max of the seeds'
    differences, which misses the truth whenever all three fall on one side: 2 (1/2)^3 = 25%."""
    rng = np.random.default_rng(9)
    c = OVERALL
    d = (lambda y: y[:, 0] - y[:, 1])(_arms(rng, 2, [c.sigma_t, 0.0], c.sigma_e))
    cover = float(((d.min(axis=-1) <= 0) & (0 <= d.max(axis=-1))).mean())
    assert cover == pytest.approx(0.75, abs=0.03) and cover < COVER[0]


def _claim_parts(rng, claim: study_design.ClaimDesign, effects: dict[str, float] | None = None,
                 seeds: int = SEEDS) -> tuple[list[inf.Estimate], list[bool]]:
    """The claim's part estimates in simulated studies. Score parts compare the claimed method
    (one arm per metric, shared by the claim's parts) with the base or another trained method
    (one per claim, or one per part in a "best" claim); other parts draw their per-seed value
    from N(effect, sd^2). effects: part -> true difference (default 0, the null)."""
    effects = effects or {}
    ests, score = [], []
    arms: dict[tuple[str, str], np.ndarray] = {}

    def arm(metric: str, name: str) -> np.ndarray:
        if (metric, name) not in arms:
            c = DESIGN.pilot[metric]
            arms[(metric, name)] = _arms(rng, 1, 0.0 if name == "base" else c.sigma_t, c.sigma_e,
                                         c.rho_e, seeds=seeds)[:, 0]
        return arms[(metric, name)]

    for key, p in claim.parts.items():
        effect = effects.get(key, 0.0)
        if p.metric is None:
            ests.append(inf.one_sample(rng.normal(effect, p.sd, (STUDIES, seeds))))
            score.append(False)
            continue
        ref = key if claim.best else p.versus
        ests.append(inf.paired(arm(p.metric, "claimed") + effect, arm(p.metric, ref)))
        score.append(True)
    return ests, score


@pytest.mark.parametrize("number", sorted(DESIGN.claims))
def test_wrong_verdicts_under_the_null_are_at_most_5_percent(number):
    claim = DESIGN.claims[number]
    rng = np.random.default_rng(100 + number)
    ests, score = _claim_parts(rng, claim)
    tests = [inf.part_tests(e, p.delta) for e, p in zip(ests, claim.parts.values())]
    verdicts = inf.claim_verdict(tests, score, best=claim.best)
    wrong_holds, wrong_fails = float((verdicts == inf.HOLDS).mean()), float((verdicts == inf.FAILS).mean())
    assert wrong_holds + wrong_fails <= 0.05, (number, wrong_holds, wrong_fails)
    # the least favourable truth for "does not hold": every part exactly at −delta (Holm's bound, alpha)
    ests, score = _claim_parts(rng, claim, {k: -p.delta for k, p in claim.parts.items()})
    tests = [inf.part_tests(e, p.delta) for e, p in zip(ests, claim.parts.values())]
    assert float((inf.claim_verdict(tests, score, best=claim.best) == inf.FAILS).mean()) <= inf.ALPHA + 0.005


def test_the_old_claim_rule_fails_the_null_check():
    """Control: claim 5 "does not hold" when any of its ten parts has its interval below 0
    (min-max of three seeds, no Holm, no margin): wrong far more often than 5%."""
    rng = np.random.default_rng(5)
    claim = DESIGN.claims[5]
    ref = {m: _arms(rng, 2, [DESIGN.pilot[m].sigma_t, 0.0], DESIGN.pilot[m].sigma_e)
           for m in {p.metric for p in claim.parts.values()}}
    claimed = {m: _arms(rng, 1, DESIGN.pilot[m].sigma_t, DESIGN.pilot[m].sigma_e)[:, 0] for m in ref}
    below = [(claimed[p.metric] - ref[p.metric][:, 1 if p.versus == "base" else 0]).max(axis=-1) < 0
             for p in claim.parts.values()]
    assert float(np.any(below, axis=0).mean()) > 0.2


def test_claim_power_matches_the_design_at_its_seeds():
    """Non-null: with every part at its smallest effect of interest, claim 2 (two independent
    parts) holds at about the power the design states, at the seeds the design asks for."""
    claim = DESIGN.claims[2]
    n = claim.seeds(DESIGN.power)
    rng = np.random.default_rng(11)
    ests, score = _claim_parts(rng, claim, {k: p.effect for k, p in claim.parts.items()}, seeds=n)
    verdicts = inf.claim_verdict([inf.part_tests(e, p.delta) for e, p in zip(ests, claim.parts.values())], score)
    assert float((verdicts == inf.HOLDS).mean()) == pytest.approx(claim.power(n), abs=0.03)

"""The near-miss families (world/families.py): enough scenes, deterministic, truths from the
painted geometry in both directions, and the judge's low error rates in every family."""
import math

import numpy as np
import torch

from margrpo.world.adversarial import SIZE
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.families import BANDS, FAMILIES, family_cases, family_rates
from margrpo.world.perceptual import delta_e
from margrpo.world.grammar import COLORS, parse_prompt
from margrpo.world.judge import WorldJudge


def test_every_family_sweeps_its_parameter_with_decided_cases_on_both_sides_where_it_has_them():
    cases = family_cases(seed=0)
    assert len(cases) >= 300 and {c.family for c in cases} == set(FAMILIES)
    for f, (_, values, ok, bad) in BANDS.items():
        mine = [c for c in cases if c.family == f]
        assert sorted({c.value for c in mine}) == sorted(values)
        truths = [c.truth for c in mine]
        assert (True in truths) == (ok is not None) and (False in truths) == (bad is not None), f
        assert sum(t is not None for t in truths) >= 10, f
        for c in mine:
            parse_prompt(c.prompt)  # every prompt is one of the world's


def test_cases_are_deterministic_in_the_seed_and_differ_across_seeds():
    a, b, c = family_cases(seed=3), family_cases(seed=3), family_cases(seed=4)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    assert torch.equal(a[7].image(), b[7].image())
    assert [x.prompt for x in a] != [x.prompt for x in c]


def test_hue_truth_follows_the_perceptual_distance_not_the_mixing_share():
    """The hue family's measure grows with the share of the neighbour colour and is 0 and
    about 1 at its ends (CIELAB difference as a share of the way to the nearest colour)."""
    cases = [c for c in family_cases(seed=0) if c.family == "hue_between"]
    for name in COLORS:
        mine = sorted((c.value, c.measure) for c in cases if c.prompt.split()[1] == name)
        measures = [m for _, m in mine]
        assert measures == sorted(measures)
        if mine and mine[0][0] == 0.0:
            assert mine[0][1] == 0.0
    assert math.isclose(delta_e(COLORS["red"], COLORS["red"]), 0.0)
    assert delta_e((1, 1, 1), (0, 0, 0)) > 99  # white to black: L* from 100 to 0


def test_family_rates_count_false_accepts_and_false_rejects():
    cases = [c for c in family_cases(seed=0) if c.family in ("notch", "touching_pair")]
    verdicts = [True if c.family == "notch" else False for c in cases]  # accept every notch, reject every pair
    rates = family_rates(cases, verdicts)
    notch = rates["notch"]
    assert notch["false_accepts"] == notch["fails"] > 0 and notch["false_rejects"] == 0
    pair = rates["touching_pair"]
    assert pair["false_rejects"] == pair["passes"] > 0 and math.isnan(pair["fa_rate"])


def test_the_judge_errs_rarely_in_every_family_and_the_reward_is_fooled_where_the_judge_is_not():
    """Regression guard for the hardened judge, on seed 1 at half the benchmark's scenes (its
    acceptance, <= 2% per family over seeds 0-2 at 20 scenes per value, is measured by
    benchmarks/judge.py --families): no false reject on the world's own renders, at most 5%
    false accepts and false rejects in every family; the training reward falls for stars,
    notches, wedges, desaturated and mixed colours that the judge refuses."""
    cases = family_cases(seed=1, repeats=10)
    images = torch.stack([c.image() for c in cases])
    metas = [parse_prompt(c.prompt) for c in cases]
    judge = family_rates(cases, WorldEvaluator(SIZE, detector=WorldJudge(SIZE)).score(images, metas)["correct"].tolist())
    reward = family_rates(cases, WorldEvaluator(SIZE).score(images, metas)["correct"].tolist())
    assert judge["world_render"]["false_rejects"] == 0, judge["world_render"]
    for f in FAMILIES:
        for rate in ("fa_rate", "fr_rate"):
            assert not judge[f][rate] > 0.05, (f, judge[f])
    for f in ("star", "notch", "wedge", "desaturated", "mixture"):
        assert reward[f]["fa_rate"] > 0.3, (f, reward[f])
    assert np.isfinite([judge[f]["fa_rate"] for f in FAMILIES if judge[f]["fails"]]).all()

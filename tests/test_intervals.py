"""The crossed seed x prompt bootstrap of the report's scores (report/intervals.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from margrpo.report.intervals import (Interval, bootstrap, metric_spec, prompt_counts, read_per_prompt,
                                      score_interval, seeds_needed)


def _values(seed_effects, prompt_effects, noise=0.0, rng=None):
    """seed -> per-prompt values: 0.5 + seed effect + prompt effect (+ independent noise)."""
    rng = rng or np.random.default_rng(0)
    return {str(s): [0.5 + a + b + (rng.normal(0, noise) if noise else 0.0) for b in prompt_effects]
            for s, a in enumerate(seed_effects)}


def test_point_is_the_mean_of_group_means_and_lies_in_the_interval():
    # Two groups of unequal size: the statistic weighs the groups equally, not the rows.
    values = {"0": [1.0, 1.0, 1.0, 0.0], "1": [1.0, 1.0, 1.0, 0.0]}
    iv = bootstrap(values, ["a", "a", "a", "b"])
    assert iv.point == pytest.approx(0.5) and iv.seeds == 2 and iv.prompts == 4
    rng = np.random.default_rng(1)
    iv = bootstrap(_values(rng.normal(0, 0.02, 3), rng.normal(0, 0.2, 60), 0.05, rng), ["a"] * 30 + ["b"] * 30)
    assert iv.low < iv.point < iv.high


def test_the_interval_widens_with_the_spread_between_prompts():
    rng = np.random.default_rng(2)
    seeds, prompts = rng.normal(0, 0.02, 3), rng.normal(0, 1, 40)
    groups = ["a"] * 20 + ["b"] * 20
    narrow = bootstrap(_values(seeds, 0.05 * prompts), groups)
    wide = bootstrap(_values(seeds, 0.2 * prompts), groups)
    assert wide.high - wide.low > 2 * (narrow.high - narrow.low)
    assert wide.prompt_var > 10 * narrow.prompt_var and wide.seed_var == pytest.approx(narrow.seed_var)


def test_a_constant_paired_difference_gives_a_degenerate_interval():
    rng = np.random.default_rng(3)
    b = _values(rng.normal(0, 0.05, 3), rng.normal(0, 0.2, 30), 0.05, rng)
    a = {s: [v + 0.1 for v in vals] for s, vals in b.items()}
    groups = ["a"] * 10 + ["b"] * 20
    paired = bootstrap(a, groups, minus=b)
    assert paired.point == pytest.approx(0.1) and paired.low == pytest.approx(0.1) and paired.high == pytest.approx(0.1)
    # control: A alone varies over seeds and prompts
    assert bootstrap(a, groups).high - bootstrap(a, groups).low > 0.05


def test_same_inputs_same_interval():
    rng = np.random.default_rng(4)
    values, groups = _values(rng.normal(0, 0.05, 3), rng.normal(0, 0.2, 30)), ["a"] * 15 + ["b"] * 15
    assert bootstrap(values, groups) == bootstrap(values, groups)
    assert bootstrap(values, groups, seed=1) != bootstrap(values, groups)  # control: the draws do matter


def test_known_variance_of_a_mean():
    # One seed, one group: the prompts' bootstrap variance of a mean is s0^2 / n (ddof 0).
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, 400)
    iv = bootstrap({"0": list(x)}, ["a"] * 400)
    assert math.isnan(iv.seed_var)
    assert iv.sd == pytest.approx(x.std() / 20, rel=0.1)
    assert (iv.high - iv.low) / 2 == pytest.approx(1.96 * x.std() / 20, rel=0.1)
    # Stratified: two groups weighted 1/2 each, so var = (s1^2/n1 + s2^2/n2) / 4.
    y = rng.normal(0, 3, 100)
    iv = bootstrap({"0": list(x) + list(y)}, ["a"] * 400 + ["b"] * 100)
    assert iv.sd == pytest.approx(math.sqrt((x.var() / 400 + y.var() / 100) / 4), rel=0.1)
    # Seeds alone (one prompt): the seeds' bootstrap variance of a mean, s0^2 / S.
    s = rng.normal(0, 1, 200)
    iv = bootstrap({str(i): [v] for i, v in enumerate(s)}, ["a"])
    assert iv.sd == pytest.approx(s.std() / math.sqrt(200), rel=0.1)
    assert iv.seed_var == pytest.approx(s.var(ddof=1)) and iv.prompt_var == pytest.approx(0.0, abs=1e-20)


def test_one_seed_resamples_only_the_prompts():
    iv = bootstrap({"0": [0.2, 0.4]}, ["a", "b"])  # one prompt per group and one seed: nothing to resample
    assert iv.low == iv.high == pytest.approx(0.3) and iv.seeds == 1


def test_a_target_missing_a_seed_pairs_on_the_common_seeds():
    a = {"0": [1.0, 1.0], "1": [2.0, 2.0], "2": [9.0, 9.0]}
    b = {"0": [0.0, 0.0], "1": [0.0, 0.0]}
    iv = bootstrap(a, ["a", "a"], minus=b)
    assert iv.seeds == 2 and iv.point == pytest.approx(1.5)
    assert bootstrap(a, ["a", "a"], minus={"7": [0.0, 0.0]}) is None  # nothing in common


def test_groups_without_prompts_and_missing_values_are_left_out():
    values = {"0": [0.2, None, 0.8, 0.6], "1": [0.2, 0.5, 0.8, math.nan]}
    # row 1 and 3 miss a value in some seed: group "b" has no prompt left, "c" is left out (None)
    iv = bootstrap(values, ["a", "b", "a", None])
    assert iv.point == pytest.approx(0.5) and iv.prompts == 2
    assert bootstrap(values, [None, "b", None, None]) is None
    with pytest.raises(ValueError, match="groups"):
        bootstrap(values, ["a"])


def test_repeated_prompt_texts_are_drawn_together():
    # Two distinct prompts, each repeated 50 times: there are two prompts' worth of evidence.
    values = {"0": [0.0] * 50 + [1.0] * 50}
    texts = ["x"] * 50 + ["y"] * 50
    clustered = bootstrap(values, ["a"] * 100, units=texts)
    rows = bootstrap(values, ["a"] * 100)
    assert clustered.point == rows.point == pytest.approx(0.5)
    assert (clustered.prompts, rows.prompts) == (2, 100)  # distinct prompts resampled
    assert clustered.high - clustered.low > 0.9 > 4 * (rows.high - rows.low)


def test_seeds_needed_projects_the_seed_component():
    # half-width 0.04 = c * sqrt(0.0012 / 3) -> c^2 = 4, times 3 / 2 for the bootstrap's
    # shrinkage of 3 seeds -> c^2 = 6; half-width(n) = sqrt(6 * 0.0012 / n) < 0.016 from n = 29
    iv = Interval(point=0.0, low=-0.04, high=0.04, seeds=3, prompts=50, seed_var=0.0012, prompt_var=0.0)
    assert seeds_needed(iv, 0.032) == 29
    assert math.sqrt(6 * 0.0012 / 29) < 0.016 < math.sqrt(6 * 0.0012 / 28)
    # The prompt component alone is wider than delta / 2: no number of seeds helps.
    assert seeds_needed(Interval(0.0, -0.04, 0.04, 3, 50, seed_var=0.0003, prompt_var=0.0003), 0.03) == math.inf
    assert seeds_needed(Interval(0.0, -0.04, 0.04, 1, 50), 0.03) is None  # one seed: no seed variance


def _per_prompt(prompts, final, best=None, ipp=2):
    return {"images_per_prompt": ipp, "prompts": prompts, "final": final, "best": best or {}}


PROMPTS = [{"prompt": "a red circle", "tag": "colors", "category": "color", "subset": "test"},
           {"prompt": "a blue square", "tag": "colors", "category": "color", "subset": "test"},
           {"prompt": "two circles", "tag": "counting", "category": None, "subset": "unseen_tag"},
           {"prompt": "a square", "tag": "single_object", "category": None, "subset": "novel"},
           {"prompt": "a furry cube", "tag": None, "category": "texture", "subset": "test"}]


def _scores(g, t):
    return {"geneval": g, "t2i": t, "proxy_geneval": g, "proxy_t2i": t}


def test_score_interval_reads_per_prompt_json():
    a = _per_prompt(PROMPTS, {"0": _scores([1.0, 0.0, 1.0, 0.0, None], [0.6, 0.4, None, None, 0.2]),
                              "1": _scores([1.0, 0.0, 1.0, 0.0, None], [0.6, 0.4, None, None, 0.2])})
    # overall: tags colors (0.5) and counting (1.0) of the test + unseen-tag prompts; the novel prompt is apart
    assert score_interval(a, "eval/geneval/overall").point == pytest.approx(0.75)
    assert score_interval(a, "eval/geneval/overall", subsets=("novel",)).point == pytest.approx(0.0)
    assert score_interval(a, "eval/geneval/colors").point == pytest.approx(0.5)
    assert score_interval(a, "eval/t2i/mean").point == pytest.approx((0.5 + 0.2) / 2)
    assert score_interval(a, "eval/proxy/geneval/counting").point == pytest.approx(1.0)
    assert score_interval(a, "eval/partial") is None and score_interval(a, "eval/geneval/position") is None
    assert score_interval(a, "eval/geneval/overall", "best") is None  # no best checkpoint scores
    b = _per_prompt(PROMPTS, {"0": _scores([0.0] * 4 + [None], [0.0] * 4 + [None])})
    paired = score_interval(a, "eval/geneval/overall", minus=b)
    assert paired.seeds == 1 and paired.point == pytest.approx(0.75)
    with pytest.raises(ValueError, match="different prompts"):
        score_interval(a, "eval/geneval/overall", minus=_per_prompt(PROMPTS[::-1], b["final"]))


def test_metric_spec_and_prompt_counts():
    assert metric_spec("eval/geneval/overall") == ("geneval", None)
    assert metric_spec("eval/t2i/spatial") == ("t2i", "spatial")
    assert metric_spec("eval/proxy/geneval/colors") == ("proxy_geneval", "colors")
    assert metric_spec("eval/partial") is None and metric_spec("reward/mean") is None
    counts = prompt_counts({"prompts": PROMPTS + [dict(PROMPTS[0])]})  # a repeated text counts once
    assert counts["test"] == {"all": 3, "colors": 2, "color": 2, "texture": 1}
    assert counts["unseen_tag"] == {"all": 1, "counting": 1} and counts["novel"]["all"] == 1


def test_read_per_prompt_restricts_seeds(tmp_path):
    assert read_per_prompt(tmp_path, "base") is None
    (tmp_path / "eval" / "grpo").mkdir(parents=True)
    data = _per_prompt(PROMPTS, {s: _scores([1.0] * 5, [0.5] * 5) for s in "012"}, {"0": _scores([1.0] * 5, [0.5] * 5)})
    (tmp_path / "eval" / "grpo" / "per_prompt.json").write_text(json.dumps(data))
    got = read_per_prompt(tmp_path, "grpo", [1, 2])
    assert set(got["final"]) == {"1", "2"} and got["best"] == {}
    assert set(read_per_prompt(tmp_path, "grpo")["final"]) == {"0", "1", "2"}


def test_a_whole_prompt_space_is_not_resampled():
    """A group that lists every prompt of its space is the population: with one seed its
    interval has no width; the same prompts as a sample of a larger space do get one."""
    values = {"0": [0.0, 1.0, 0.0, 1.0]}
    groups, units = ["a"] * 4, ["p", "q", "r", "s"]
    whole = bootstrap(values, groups, units=units, complete=[True] * 4)
    sample = bootstrap(values, groups, units=units, complete=[False] * 4)
    assert whole.low == whole.high == whole.point == 0.5
    assert sample.high - sample.low > 0.4


def test_score_interval_reads_the_pool_sizes():
    prompts = [{"prompt": t, "tag": "single_object", "category": None, "subset": "unseen_tag", "pool": 2}
               for t in ("a circle", "a square")]
    data = {"prompts": prompts, "final": {"0": {"geneval": [0.0, 1.0]}, "1": {"geneval": [0.5, 0.5]}}}
    iv = score_interval(data, "eval/geneval/overall", method="bootstrap")
    assert iv.low == 0.5 and iv.high == 0.5   # the seeds agree on the mean; the space is listed whole
    del prompts[0]["pool"]                    # without a pool size the prompts are a sample
    assert score_interval(data, "eval/geneval/overall", method="bootstrap").high > 0.5


def test_score_interval_is_a_t_interval_over_seeds():
    # per seed: mean over tags of the tag mean; grpo − base in the committed study per seed
    gains = [0.057, 0.001, 0.081]
    prompts = [{"prompt": "p", "tag": "colors", "category": None, "subset": "test"}]
    data = {"prompts": prompts, "final": {str(s): {"geneval": [0.3 + g]} for s, g in enumerate(gains)}}
    base = {"prompts": prompts, "final": {str(s): {"geneval": [0.3]} for s in range(3)}}
    iv = score_interval(data, "eval/geneval/overall", minus=base)
    # mean 0.046333, se 0.023702, t_0.975(2) = 4.302653 (tests/test_inference.py)
    assert (iv.point, iv.low, iv.high) == pytest.approx((0.046333, -0.05565, 0.14832), abs=1e-4)
    assert iv.df == 2 and iv.se == pytest.approx(0.023702, abs=1e-6) and iv.seeds == 3
    one = score_interval({"prompts": prompts, "final": {"0": {"geneval": [0.4]}}}, "eval/geneval/overall")
    assert math.isnan(one.low) and one.cell() == "0.400 (one seed: no interval)"

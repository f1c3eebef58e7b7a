"""The report's learning checks: reward rise in standard errors, per-tag held-out changes,
and the reward-hacking flags (reward vs held-out tags of one run; proxy vs judge over seeds)."""
import math

import pytest

from margrpo.report.learning import (HACKING_MIN_GAP, PAIRED_KEY, RAW_KEY, proxy_judge_changes, reward_hacking,
                                     reward_rise, rise_key, steps_to_detect, tag_changes)


def _history(values):
    return [{"step": i + 1, "reward/mean": v} for i, v in enumerate(values)]


def _evals(*rows):
    return [{"step": 10 * i, **{f"eval/geneval/{k}": v for k, v in r.items()}} for i, r in enumerate(rows)]


def test_reward_rise_in_standard_errors():
    flat = _history([0.5, 0.6] * 20)
    assert abs(reward_rise(flat)["rise"]) < 1e-12 and abs(reward_rise(flat)["z"]) < 1e-6
    rising = _history([0.5 + 0.01 * i + (0.02 if i % 2 else -0.02) for i in range(40)])
    r = reward_rise(rising)
    assert r["rise"] == pytest.approx(0.30, abs=1e-9) and r["z"] > 10
    with pytest.raises(ValueError, match="at least 20 steps"):
        reward_rise(_history([0.5] * 19))


def test_steps_to_detect_projects_the_fitted_trend():
    # slope 0.01 per step, residuals +-0.1 (sd 0.1 * sqrt(n / (n - 2))): the window difference
    # needs 0.01 * (n - 10) >= 3 * noise * sqrt(2 / 10), about 24 steps.
    def line(n):
        return _history([0.5 + 0.01 * i + (0.1 if i % 2 else -0.1) for i in range(n)])

    r = steps_to_detect(line(40))
    assert r["slope"] == pytest.approx(0.01, abs=1e-3)
    assert r["noise"] == pytest.approx(0.1 * math.sqrt(40 / 38), rel=0.02)
    assert r["steps"] == 10 + math.ceil(3 * r["noise"] * math.sqrt(0.2) / r["slope"]) == 24
    # reward_rise on a run of that length reads about 3 (a little less: its window variance
    # includes the trend within each window), and clearly less a few steps earlier.
    z = reward_rise(line(24))["z"]
    assert abs(z - 3) < 0.3 and reward_rise(line(21))["z"] < z - 0.4
    # Never fewer steps than two windows; no rise to detect on a falling reward.
    assert steps_to_detect(_history([0.5 + 0.01 * i for i in range(30)]))["steps"] == 20
    assert steps_to_detect(_history([0.6 - 0.01 * i for i in range(30)]))["steps"] == math.inf


def test_tag_changes_use_binomial_standard_errors():
    c = tag_changes(_evals({"colors": 0.5, "overall": 0.5}, {"colors": 0.3, "overall": 0.4}), images_per_tag=100)
    assert set(c) == {"colors"}
    assert c["colors"]["change"] == pytest.approx(-0.2)
    assert c["colors"]["se"] == pytest.approx(math.sqrt((0.25 + 0.21) / 100))


def test_reward_hacking_needs_a_rising_reward_and_a_falling_tag():
    rising = _history([0.5 + 0.01 * i + (0.02 if i % 2 else -0.02) for i in range(40)])
    flat = _history([0.5, 0.6] * 20)
    fell = _evals({"colors": 0.7, "counting": 0.5}, {"colors": 0.3, "counting": 0.55})
    held = _evals({"colors": 0.7, "counting": 0.5}, {"colors": 0.66, "counting": 0.55})
    assert reward_hacking(rising, fell, images_per_tag=128) == ["colors"]
    assert reward_hacking(flat, fell, images_per_tag=128) == []  # the reward did not rise
    assert reward_hacking(rising, held, images_per_tag=128) == []  # -0.04 is within 2 se


def test_the_paired_rise_removes_the_prompt_draw_noise():
    # Each step's prompts shift the reward of base and policy alike (difficulty d); the
    # policy gains 0.004 per step over the base on the same draw.
    import random

    rng = random.Random(0)
    rows = []
    for i in range(60):
        d, base_noise = rng.gauss(0, 0.05), rng.gauss(0, 0.005)
        base = 0.5 + d + base_noise
        reward = base + 0.004 * i + rng.gauss(0, 0.005)
        rows.append({"step": i + 1, RAW_KEY: reward, "reward/base_mean": base, PAIRED_KEY: reward - base})
    assert rise_key(rows) == PAIRED_KEY and rise_key([{k: v for k, v in r.items() if k != PAIRED_KEY} for r in rows]) == RAW_KEY
    assert rise_key(rows[:5] + [{RAW_KEY: 0.5}]) == RAW_KEY  # every step must have it
    raw, paired = reward_rise(rows, key=RAW_KEY), reward_rise(rows, key=PAIRED_KEY)
    assert paired["rise"] == pytest.approx(0.2, abs=0.02)
    assert paired["z"] > 3 and paired["z"] > 3 * raw["z"]


def test_a_one_step_window_has_no_spread():
    r = reward_rise(_history([0.5, 0.7]), window=1)
    assert r["rise"] == pytest.approx(0.2) and r["se"] == 0.0 and r["z"] == math.inf


def _judged(first: dict, last: dict) -> list[dict]:
    """Two in-training evaluations: tag -> (proxy, judge) at step 0 and at the last step."""
    return [{"step": step, **{f"eval/geneval/{t}": j for t, (_, j) in row.items()},
             **{f"eval/proxy/geneval/{t}": p for t, (p, _) in row.items()}}
            for step, row in ((0, first), (20, last))]


def test_proxy_rising_while_the_judge_falls_is_flagged_over_seeds():
    start = {"colors": (0.5, 0.5), "counting": (0.4, 0.4)}
    # colors: the proxy gains ~0.15, the judge loses ~0.05 in every seed; counting: both gain alike
    evals = {s: _judged(start, {"colors": (0.65 + d, 0.45 - d), "counting": (0.5 + d, 0.5 + d)})
             for s, d in zip((0, 1, 2), (0.0, 0.01, -0.01))}
    c = proxy_judge_changes(evals)
    assert set(c) == {"colors", "counting"} and c["colors"]["seeds"] == 3
    assert c["colors"]["proxy"] == pytest.approx(0.15) and c["colors"]["judge"] == pytest.approx(-0.05)
    assert c["colors"]["gap"] == pytest.approx(0.2) and c["colors"]["gap_se"] == pytest.approx(0.02 / math.sqrt(3))
    assert c["colors"]["hacking"] and not c["counting"]["hacking"]


def test_the_hacking_flag_does_not_fire_on_noise():
    start = {"colors": (0.5, 0.5)}
    # a gap far beyond its (tiny) standard error but smaller than the minimum that matters
    tiny = {s: _judged(start, {"colors": (0.51 + 0.0001 * s, 0.49)}) for s in range(3)}
    assert tiny and 0 < proxy_judge_changes(tiny)["colors"]["gap"] < HACKING_MIN_GAP
    assert not proxy_judge_changes(tiny)["colors"]["hacking"]
    # a large mean gap that is within its noise over seeds
    noisy = {s: _judged(start, {"colors": (0.5 + g, 0.49)}) for s, g in enumerate((0.4, -0.3, 0.05))}
    assert not proxy_judge_changes(noisy)["colors"]["hacking"]
    # the proxy did not rise: the two detectors part, but nothing was gamed
    fell = {s: _judged(start, {"colors": (0.45 + 0.01 * s, 0.2)}) for s in range(3)}
    assert not proxy_judge_changes(fell)["colors"]["hacking"]
    # one seed: no standard error, no flag
    one = {0: _judged(start, {"colors": (0.8, 0.3)})}
    c = proxy_judge_changes(one)["colors"]
    assert math.isnan(c["gap_se"]) and not c["hacking"]


def test_records_without_the_proxy_have_no_proxy_judge_changes():
    old = {0: _evals({"colors": 0.5}, {"colors": 0.3})}
    assert proxy_judge_changes(old) == {} and proxy_judge_changes({0: []}) == {}


def _rows(purpose, values):
    return [{"prompt": purpose, "purpose": purpose, "aligned": v, "geneval_correct": float(v > 0.5)} for v in values]


def test_best_of_is_per_group_and_per_purpose():
    from margrpo.probes.samples import best_of

    rows = _rows("colors", [0.2, 0.9, 0.1, 0.4]) + _rows("position", [0.0, 0.0, 0.0, 0.6])
    t = best_of(rows, 4)
    assert [c[0] for c in t["overall"]["aligned"]] == [1, 2, 4]
    assert t["colors"]["aligned"][0][1] == pytest.approx(0.4)       # k = 1: the mean
    assert t["colors"]["aligned"][2][1] == pytest.approx(0.9)       # k = 4: the group's best
    assert t["position"]["geneval_correct"][1][1] == pytest.approx(0.5)  # pass@2 with 1 of 4: 1 - C(3,2)/C(4,2)
    assert t["overall"]["aligned"][2][1] == pytest.approx(0.75)     # mean of the two groups' best
    with pytest.raises(ValueError, match="multiple of group 4"):
        best_of(rows[:5], 4)


def test_scored_samples_keep_the_best_image_of_each_group():
    import torch

    from conftest import tiny_params
    from margrpo.config import load_params
    from margrpo.probes.samples import ScoredSamples
    from margrpo.world.grammar import parse_prompt
    from margrpo.world.paint import Paint, paint

    size = tiny_params().world.image_size
    right = paint([Paint("circle", size / 2, size / 2, size / 4, "red")], size=size)
    blank = torch.ones(3, size, size)
    prompts = ["a red circle"] * 2 + ["a blue square"] * 2
    metas = [{"prompt": p, **parse_prompt(p)} for p in prompts]
    with pytest.raises(ValueError, match="add {name: world} to rewards"):
        ScoredSamples(tiny_params())
    s = ScoredSamples(load_params("params.yaml", {"world.image_size": size}), keep_best=2)
    with pytest.raises(ValueError, match="no kept images"):
        s.sample(2, torch.Generator().manual_seed(0))
    aligned = s(torch.stack([blank, right, blank, blank]), prompts, metas)
    assert float(aligned[1]) > float(aligned[0]) and s.rows[1]["geneval_correct"] == 1.0
    assert s.best_prompts == ["a red circle", "a blue square"] and torch.equal(s.best_images[0], right)
    images, drawn = s.sample(8, torch.Generator().manual_seed(0))
    assert images.shape == (8, 3, size, size) and set(drawn) <= set(prompts)

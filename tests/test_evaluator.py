"""World evaluator: GenEval / T2I rule edge cases on hand-made Detections, and accuracy of
the pixel detector + rules on right and deliberately wrong renders."""
import math

import pytest
import torch
from scipy import ndimage

from margrpo.eval.detections import Detection
from margrpo.eval.geneval import geneval_correct, geneval_summary, relative_position
from margrpo.eval.t2i import (complex_score, noun_phrases, numeracy_score, spatial_score,
                              t2i_score, vqa_product)
from margrpo.rewards.base import build_reward
from margrpo.world import prompts as P
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.generate import grid_prompt_indices, prompt_grid
from margrpo.world.grammar import parse_prompt
from margrpo.world.render import render


def det(label, box, score=0.95, **attrs):
    return Detection(label, score, box, attributes=attrs)


# ---------------------------------------------------------------- GenEval rules


def test_counting_is_exact_and_uses_counting_threshold():
    meta = parse_prompt("three circles")
    boxes = [(0, 0, 8, 8), (16, 0, 24, 8), (0, 16, 8, 24), (16, 16, 24, 24)]
    three = [det("circle", b) for b in boxes[:3]]
    assert geneval_correct(meta, three) == (True, "")
    ok, why = geneval_correct(meta, three + [det("circle", boxes[3])])
    assert not ok and "circle<4, found 4" in why
    ok, why = geneval_correct(meta, three[:2])
    assert not ok and "circle>=3, found 2" in why
    # 0.5 passes the normal threshold but not the counting one (0.9).
    ok, why = geneval_correct(meta, three[:2] + [det("circle", boxes[2], score=0.5)])
    assert not ok
    assert geneval_correct(parse_prompt("a circle"), [det("circle", boxes[0], score=0.5)])[0]
    assert not geneval_correct(parse_prompt("a circle"), [det("circle", boxes[0], score=0.3)])[0]


def test_max_per_class():
    meta = {"tag": "counting", "include": [{"class": "circle", "count": 3}],
            "exclude": [{"class": "circle", "count": 4}]}
    many = [det("circle", (i, 0, i + 1, 1)) for i in range(5)]
    assert geneval_correct(meta, many, max_per_class=3)[0]
    assert not geneval_correct(meta, many)[0]


def test_colour_mismatch_and_missing_attribute():
    meta = parse_prompt("a red circle and a blue square")
    good = [det("circle", (0, 0, 8, 8), color="red"), det("square", (16, 0, 24, 8), color="blue")]
    assert geneval_correct(meta, good)[0]
    bad = [det("circle", (0, 0, 8, 8), color="blue"), det("square", (16, 0, 24, 8), color="red")]
    ok, why = geneval_correct(meta, bad)
    assert not ok and "expected red circle>=1, found 0 red" in why and "expected blue square" in why
    ok, why = geneval_correct(meta, [det("circle", (0, 0, 8, 8)), good[1]])
    assert not ok and "unknown" in why
    # Colour is judged on the most confident object only, as in GenEval.
    two = [det("circle", (0, 0, 8, 8), score=0.99, color="blue"), det("circle", (0, 16, 8, 24), color="red")]
    assert not geneval_correct(parse_prompt("a red circle"), two)[0]


def test_position_margin_and_convention():
    meta = parse_prompt("a circle left of a square")      # include = [square, circle@left of 0]
    square = det("square", (20, 0, 30, 10))
    assert geneval_correct(meta, [det("circle", (0, 0, 10, 10)), square])[0]
    ok, why = geneval_correct(meta, [det("circle", (40, 0, 50, 10)), square])
    assert not ok and "found right of target" in why
    # Offset (-10, 9), margins 0.1 x (10 + 10) = 2 per axis -> shrunk (-8, 7), divided
    # by the unshrunk norm hypot(10, 9) = 13.45 -> (-0.59, 0.52): left of and below.
    a, b = det("circle", (0, 9, 10, 19)), det("square", (10, 0, 20, 10))
    assert relative_position(a, b) == {"left of", "below"}
    # Offset 2 is inside the margin (2): no relation; without a margin, "left of".
    a, b = det("circle", (0, 0, 10, 10)), det("square", (2, 0, 12, 10))
    assert relative_position(a, b) == set()
    assert relative_position(a, b, margin=0.0) == {"left of"}
    assert not geneval_correct(meta, [a, b])[0]
    assert geneval_correct(meta, [a, b], position_margin=0.0)[0]
    assert relative_position(det("c", (0, 0, 10, 10)), det("s", (0, 20, 10, 30))) == {"above"}


def test_position_missing_target_and_summary():
    meta = parse_prompt("a circle above a square")
    ok, why = geneval_correct(meta, [det("circle", (0, 0, 10, 10))])
    assert not ok and "square>=1, found 0" in why and "no target for circle" in why
    rows = [{"tag": "a", "correct": True}, {"tag": "a", "correct": False}, {"tag": "b", "correct": True}]
    assert geneval_summary(rows) == {"a": 0.5, "b": 1.0, "overall": 0.75}


# ---------------------------------------------------------------- T2I rules


def test_t2i_rules():
    meta = parse_prompt("a red circle on the left of a blue square")
    assert noun_phrases(meta) == ["a blue square", "a red circle"]
    assert noun_phrases(parse_prompt("two circles and a square")) == ["two circles", "a square"]
    assert vqa_product([0.5, 0.5]) == 0.25
    circle, square = det("circle", (0, 0, 10, 10), 0.8), det("square", (20, 0, 30, 10), 0.8)
    assert spatial_score(meta, [circle, square]) == pytest.approx(0.25 * 0.8 * 2 + 0.5)
    assert spatial_score(meta, [det("circle", (20, 0, 30, 10)), det("square", (0, 0, 10, 10))]) == 0
    assert spatial_score(meta, [circle]) == 0                          # 0.25 * 0.8 < 0.5
    num = parse_prompt("two circles and a square")
    two = [det("circle", (0, 0, 8, 8)), det("circle", (16, 0, 24, 8))]
    assert numeracy_score(num, two + [det("square", (0, 16, 8, 24))]) == 1.0
    assert numeracy_score(num, two[:1] + [det("square", (0, 16, 8, 24))]) == 0.75
    assert numeracy_score(num, two + [det("circle", (0, 0, 8, 8))]) == 0.5   # duplicate box merged
    assert complex_score({"attribute": 1.0, "spatial": 0.0}) == 0.5
    col = parse_prompt("a red circle and a blue square")
    sure = [Detection("circle", 1.0, (0, 0, 8, 8), {"color": "red"}, {"color": 0.9}),
            Detection("square", 1.0, (16, 0, 24, 8), {"color": "green"}, {"color": 0.9})]
    assert t2i_score(col, sure) == pytest.approx(0.9 * 0.1)


# ---------------------------------------------------------------- detector + rules on renders


@pytest.fixture(scope="module")
def batch():
    # The test-only tags (single_object, two_object, counting) are in the test split alone.
    rows = (P.make_prompt_set("train", 25, seed=0) + P.make_prompt_set("heldout", 25, seed=1)
            + [m for m in P.make_test_set(25, 0, seed=2) if m["tag"] in P.TEST_ONLY])
    images = render(P.sample_scenes(rows, torch.Generator().manual_seed(0)))
    return rows, images


def _by_group(rows, values):
    out = {}
    for m, v in zip(rows, values.tolist()):
        for key in (m["tag"], m["category"]):
            if key and not math.isnan(v):
                out.setdefault(key, []).append(v)
    return {k: sum(v) / len(v) for k, v in out.items()}


def test_ground_truth_renders_score_perfectly(batch):
    rows, images = batch
    s = WorldEvaluator().score(images, rows)
    for metric in ("geneval", "t2i"):
        for key, acc in _by_group(rows, s[metric]).items():
            assert acc >= 0.99, (metric, key, acc)
    assert s["partial"].min() == 1.0
    assert all(math.isnan(g) == (m["tag"] is None) for g, m in zip(s["geneval"].tolist(), rows))
    summ = WorldEvaluator.summarize(rows, s)
    assert summ["eval/geneval/overall"] == 1.0 and "eval/t2i/numeracy" in summ


def test_noisy_blurred_renders_still_score(batch):
    rows, images = batch
    x = torch.from_numpy(ndimage.gaussian_filter(images.numpy(), (0, 0, 0.5, 0.5)))
    x = (x + 0.08 * torch.randn(x.shape, generator=torch.Generator().manual_seed(0))).clamp(0, 1)
    s = WorldEvaluator().score(x, rows)
    for key, acc in _by_group(rows, s["geneval"]).items():
        assert acc >= 0.95, (key, acc)
    assert s["partial"].mean() >= 0.98


@pytest.mark.parametrize("kind", ["wrong_color", "wrong_shape", "wrong_count",
                                  "swapped_relation", "missing_object"])
def test_wrong_renders_fail(batch, kind):
    rows, _ = batch
    gen = torch.Generator().manual_seed(1)
    pairs = [(m, P.corrupt_scene(m, kind, gen)) for m in rows]
    pairs = [(m, sc) for m, sc in pairs if sc is not None]
    metas = [m for m, _ in pairs]
    s = WorldEvaluator().score(render([sc for _, sc in pairs]), metas)
    gen_scores = s["geneval"][~s["geneval"].isnan()]
    assert gen_scores.numel() > 0 and gen_scores.mean() <= 0.05
    assert s["partial"].max() < 1.0
    # Attribute-binding and spatial T2I scores drop too (numeracy and complex keep the
    # partial credit their official rules give).
    t2i = [v for m, v in zip(metas, s["t2i"].tolist()) if m["category"] in ("color", "shape", "texture")]
    if kind in ("wrong_shape", "missing_object", "wrong_color"):
        assert t2i and sum(t2i) / len(t2i) <= 0.05


def test_reward_modes(batch):
    """Every reward mode scores correct renders at the top (speed: benchmarks/evaluator.py)."""
    rows, images = batch
    for mode in ("partial", "geneval", "t2i", "mix"):
        r = build_reward("world", mode=mode)(images[:8], [m["prompt"] for m in rows[:8]], rows[:8])
        assert r.shape == (8,) and not r.isnan().any() and r.min() >= 0.99
    with pytest.raises(ValueError, match="mode"):
        build_reward("world", mode="nope")


def test_grid_prompts_cover_tags_without_repeats():
    metas = [{"prompt": "a circle", "tag": "single_object"}] * 5 + [
        {"prompt": "a square", "tag": "single_object"},
        {"prompt": "two circles", "tag": "counting"},
        {"prompt": "a red circle", "tag": "colors"},
        {"prompt": "a red circle", "tag": "colors"},
        {"prompt": "a striped square", "category": "texture"},
    ]
    idx = grid_prompt_indices(metas, 5)
    assert [metas[i]["prompt"] for i in idx] == ["a circle", "two circles", "a red circle",
                                                 "a striped square", "a square"]
    assert len(grid_prompt_indices(metas, 50)) == 5  # only distinct prompts
    images = torch.rand(len(metas), 2, 3, 8, 8)
    assert prompt_grid(images, metas, 3).size[1] > 0

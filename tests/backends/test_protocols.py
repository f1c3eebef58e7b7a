"""GenEval / T2I-CompBench protocol drivers on hand-made detections and VQA answers with
known correct results; output files in the official layouts."""
from __future__ import annotations

import json

import pytest
from PIL import Image

from margrpo.eval.detections import Detection
from margrpo.eval.protocols import geneval_protocol as gp
from margrpo.eval.protocols import t2i_protocol as tp


class ByWidth:
    """Fake detector: the detections to return are keyed by the image width."""

    def __init__(self, table):
        self.table = table

    def detect(self, image, class_names):
        return [d for d in self.table[image.width] if d.label in class_names]


class FixedColor:
    def __init__(self, color):
        self.color = color

    def classify(self, crop, cls, values):
        assert self.color in values
        return self.color, 0.9


def write_geneval(root, idx, meta, widths):
    d = root / f"{idx:05d}"
    (d / "samples").mkdir(parents=True)
    (d / "metadata.jsonl").write_text(json.dumps(meta) + "\n")
    for i, w in enumerate(widths):
        Image.new("RGB", (w, 64)).save(d / "samples" / f"{i:04d}.png")


def test_geneval_driver_known_outcomes(tmp_path):
    root = tmp_path / "imgs"
    single = {"tag": "single_object", "include": [{"class": "cow", "count": 1}], "prompt": "a photo of a cow"}
    counting = {"tag": "counting", "include": [{"class": "dog", "count": 2}],
                "exclude": [{"class": "dog", "count": 3}], "prompt": "a photo of two dogs"}
    position = {"tag": "position", "include": [{"class": "cat", "count": 1},
                {"class": "dog", "count": 1, "position": ["left of", 0]}], "prompt": "a dog left of a cat"}
    write_geneval(root, 0, single, [100, 101])
    write_geneval(root, 1, counting, [102, 103])
    write_geneval(root, 2, position, [104, 105])
    box = lambda x: (x, 10.0, x + 15.0, 30.0)
    table = {
        100: [Detection("cow", 0.8, box(0))],                     # correct
        101: [Detection("cow", 0.2, box(0))],                     # below 0.3: wrong
        102: [Detection("dog", 0.95, box(0)), Detection("dog", 0.92, box(40)),
              Detection("dog", 0.5, box(70))],                    # 2 above 0.9: correct
        103: [Detection("dog", 0.95, box(0)), Detection("dog", 0.92, box(30)),
              Detection("dog", 0.91, box(60))],                   # 3: wrong
        104: [Detection("dog", 0.9, box(0)), Detection("cat", 0.9, box(80))],   # correct
        105: [Detection("dog", 0.9, box(80)), Detection("cat", 0.9, box(0))],   # dog right of cat
    }
    summary = gp.run_geneval(root, tmp_path / "out", ByWidth(table), FixedColor("red"))
    rows = [json.loads(l) for l in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert [r["correct"] for r in rows] == [True, False, True, False, True, False]
    assert set(rows[0]) >= {"filename", "tag", "prompt", "correct", "reason", "metadata", "details"}
    assert json.loads(rows[0]["metadata"]) == single
    assert summary["single_object"] == 0.5 and summary["overall"] == pytest.approx(0.5)
    assert "protocol re-implementation" in json.loads((tmp_path / "out" / "summary.json").read_text())["label"]


def test_geneval_colour_from_attribute_scorer():
    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}], "prompt": "a red car"}
    img = Image.new("RGB", (64, 64))
    det = ByWidth({64: [Detection("car", 0.9, (5.0, 5.0, 40.0, 40.0))]})
    assert gp.score_image(img, meta, det, FixedColor("red"), ["car"])[0] is True
    ok, reason, dets = gp.score_image(img, meta, det, FixedColor("blue"), ["car"])
    assert ok is False and dets[0].attributes["color"] == "blue" and "red" in reason


class FakeVQA:
    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def p_yes(self, image, questions):
        self.asked += questions
        return [self.answers[q] for q in questions]


class FakeClip:
    def cosine(self, image, text):
        return 0.31


def write_t2i(folder, prompts):
    folder.mkdir(parents=True)
    for i, p in enumerate(prompts):
        Image.new("RGB", (64 + i, 64)).save(folder / f"{p}_{i:06d}.png")


def test_t2i_attribute_vqa_product_and_official_file(tmp_path):
    write_t2i(tmp_path / "img" / "color", ["a green bench and a red car", "a blue bird"])
    vqa = FakeVQA({"a green bench?": 0.9, "a red car?": 0.5, "a blue bird?": 0.2})
    out = tp.run_t2i(tmp_path / "img", tmp_path / "out", ["color"], vqa=vqa)
    res = json.loads((tmp_path / "out" / "color" / "annotation_blip" / "vqa_result.json").read_text())
    assert res == [{"question_id": 0, "answer": pytest.approx(0.45)}, {"question_id": 1, "answer": pytest.approx(0.2)}]
    assert out["categories"]["color"]["score"] == pytest.approx(0.325)
    assert "protocol re-implementation" in out["label"]


def test_t2i_spatial_numeracy_complex_rules(tmp_path):
    meta = tp.parse_spatial("a balloon on the left of a giraffe")
    assert meta["include"] == [{"class": "giraffe", "count": 1},
                               {"class": "balloon", "count": 1, "position": ["left of", 0]}]
    img = Image.new("RGB", (100, 100))
    good = ByWidth({100: [Detection("balloon", 0.9, (0, 40, 20, 60)), Detection("giraffe", 0.9, (70, 40, 90, 60))]})
    bad = ByWidth({100: [Detection("balloon", 0.9, (70, 40, 90, 60)), Detection("giraffe", 0.9, (0, 40, 20, 60))]})
    # 0.25 * 0.9 + 0.25 * 0.9 + 0.5 * (relation holds); totals under 0.5 become 0
    assert tp.score_prompt("spatial", "a balloon on the left of a giraffe", img, detector=good) == pytest.approx(0.95)
    assert tp.score_prompt("spatial", "a balloon on the left of a giraffe", img, detector=bad) == 0.0
    assert tp.score_prompt("spatial", "a cat next to a dog", img, detector=good) is None
    assert tp.parse_numeracy("three dogs and two cats")["include"] == [
        {"class": "dog", "count": 3}, {"class": "cat", "count": 2}]
    dets = [Detection("dog", 0.9, (x, 0, x + 10, 10)) for x in (0, 20, 40)] + [Detection("cat", 0.9, (60, 0, 70, 10))]
    # dogs: present and exact (0.5); cats: present, wrong count (0.25)
    assert tp.score_prompt("numeracy", "three dogs and two cats", img, detector=ByWidth({100: dets})) == 0.75
    vqa = FakeVQA({"a balloon on the left of a giraffe?": 0.5})
    s = tp.score_prompt("complex", "a balloon on the left of a giraffe", img, vqa=vqa, detector=good, clip=FakeClip())
    assert s == pytest.approx((0.5 + 0.31 + 0.95) / 3)
    assert tp.score_prompt("non_spatial", "a man riding a horse", img, clip=FakeClip()) == 0.31


def test_shipped_prompt_sets():
    data = gp.data_dir("geneval")
    lines = (data / "evaluation_metadata.jsonl").read_text().splitlines()
    assert len(lines) == 553 and len(gp.load_class_names()) == 80
    assert (data / "LICENSE").exists() and (gp.data_dir("t2i_compbench") / "LICENSE").exists()


def test_data_found_outside_the_checkout_dir_or_named_when_missing(tmp_path, monkeypatch):
    """From another working directory the checkout's data/ is still found; with a class-name
    file that does not exist the error names it."""
    monkeypatch.chdir(tmp_path)
    assert len(gp.load_class_names()) == 80
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        gp.load_class_names(tmp_path / "nope.txt")

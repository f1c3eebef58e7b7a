"""T2I-CompBench++ 3d_spatial (protocol re-implementation): the depth rule on hand-made
detections + depth maps with known answers, the driver writing the official result file,
the shipped prompt set, and the transformers DPT depth adapter on a tiny random model."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from margrpo.eval import t2i
from margrpo.eval.detections import Detection
from margrpo.eval.protocols import t2i_protocol as tp

from .conftest import NEED_TRANSFORMERS, need

# 100 x 100 map, larger = nearer: background 0.2, a near patch over rows 40-80, cols 20-60
DEPTH = np.full((100, 100), 0.2)
DEPTH[40:80, 20:60] = 0.9
DOG = Detection("dog", 0.8, (20, 40, 60, 80))    # exactly the near patch: mean 0.9
DESK = Detection("desk", 0.6, (30, 30, 90, 90))  # mean (1200*0.9 + 2400*0.2)/3600 = 0.4333
# IoU(DOG, DESK) = 1200 / (1600 + 3600 - 1200) = 0.3 -> pos = 0.3 / 0.5 = 0.6 when ordered


def meta(a: str, rel: str, b: str) -> dict:
    return {"category": "3d_spatial",
            "include": [{"class": b, "count": 1}, {"class": a, "count": 1, "position": [rel, 0]}]}


def test_mean_box_depth_and_official_transposed_crop():
    assert t2i.mean_box_depth(DEPTH, DOG.box) == pytest.approx(0.9)
    assert t2i.mean_box_depth(DEPTH, DESK.box) == pytest.approx((1200 * 0.9 + 2400 * 0.2) / 3600)
    left_near = np.zeros((100, 100))
    left_near[:, :50] = 1.0
    box = (0, 60, 40, 100)  # x 0-40 (near), y 60-100
    assert t2i.mean_box_depth(left_near, box) == 1.0
    assert t2i.mean_box_depth(left_near, box, transposed=True) == 0.0  # reads rows 0-40, cols 60-100
    assert np.isnan(t2i.mean_box_depth(DEPTH, (10, 10, 10, 50)))  # empty crop


@pytest.mark.parametrize("a, rel, b, pos", [
    ("dog", "in front of", "desk", 0.6),   # the dog is nearer: holds, partial overlap
    ("dog", "behind", "desk", 0.0),
    ("dog", "hidden", "desk", 0.0),
    ("desk", "behind", "dog", 0.6),
    ("desk", "hidden", "dog", 0.6),
    ("desk", "in front of", "dog", 0.0),
])
def test_front_behind_hidden_known_answers(a, rel, b, pos):
    dets = [DOG, DESK]
    assert t2i.depth_position(rel, {"dog": DOG, "desk": DESK}[a].box,
                              {"dog": DOG, "desk": DESK}[b].box, DEPTH) == pytest.approx(pos)
    want = 0.25 * 0.8 + 0.25 * 0.6 + 0.5 * pos
    assert t2i.spatial3d_score(meta(a, rel, b), dets, DEPTH) == pytest.approx(want)
    assert t2i.t2i_score(meta(a, rel, b), dets, depth=DEPTH) == pytest.approx(want)


def test_overlap_rules_and_missing_objects():
    d = np.full((100, 100), 0.1)
    d[20:80, 20:80] = 0.7
    near, far = Detection("cat", 0.9, (20, 20, 80, 80)), Detection("sofa", 0.9, (25, 25, 85, 85))
    # IoU 3025 / 4175 = 0.72 > 0.5 and the cat is nearer: full credit
    assert t2i.depth_position("in front of", near.box, far.box, d) == 1.0
    # right order but no overlap at all: 0 (the official rule asks for occlusion)
    apart = Detection("sofa", 0.9, (85, 0, 100, 15))
    assert t2i.depth_position("in front of", near.box, apart.box, d) == 0.0
    # a flat map (what the adapter returns for a constant prediction): no order holds
    flat = np.zeros((100, 100))
    assert t2i.depth_position("behind", near.box, far.box, flat) == 0.0
    assert t2i.depth_position("in front of", near.box, far.box, flat) == 0.0
    m = meta("cat", "in front of", "sofa")
    assert t2i.spatial3d_score(m, [near], d) == pytest.approx(0.225)   # only A found
    assert t2i.spatial3d_score(m, [far], d) == pytest.approx(0.225)    # only B found
    assert t2i.spatial3d_score(m, [Detection("dog", 0.99, near.box)], d) == 0.0
    # highest-scoring detection of a class is the one used; no 0.5 cut as in 2D spatial
    weak = Detection("cat", 0.3, (85, 0, 100, 15))
    assert t2i.spatial3d_score(m, [weak, near, far], d) == pytest.approx(0.45 + 0.5)
    assert t2i.spatial3d_score(m, [weak, far], d) == pytest.approx(0.25 * 0.3 + 0.25 * 0.9)
    with pytest.raises(ValueError, match="depth"):
        t2i.t2i_score(m, [near, far])
    with pytest.raises(ValueError, match="3D relation"):
        t2i.depth_position("left of", near.box, far.box, d)


class Fixed:
    """Fake detector and depth backend: what to return is keyed by the image width."""

    def __init__(self, dets=None, maps=None):
        self.dets, self.maps, self.asked = dets or {}, maps or {}, []

    def detect(self, image, class_names):
        self.asked.append(list(class_names))
        return self.dets[image.width]

    def depth(self, image):
        return self.maps[image.width]


def test_parse_and_driver_write_official_file(tmp_path):
    assert tp.parse_spatial_3d("a chair hidden by a mouse")["include"] == [
        {"class": "mouse", "count": 1}, {"class": "chair", "count": 1, "position": ["hidden", 0]}]
    assert tp.parse_spatial_3d("a dog in front of a desk")["include"][1]["position"] == ["in front of", 0]
    assert tp.parse_spatial_3d("a cat on the left of a dog") is None
    prompts = ["a dog in front of a desk", "a dog behind a desk", "a cat next to a dog"]
    folder = tmp_path / "img" / "3d_spatial"
    folder.mkdir(parents=True)
    for i, p in enumerate(prompts):
        Image.new("RGB", (100 + i, 100)).save(folder / f"{p}_{i:06d}.png")
    maps = {100 + i: np.pad(DEPTH, ((0, 0), (0, i)), constant_values=0.2) for i in range(3)}
    fake = Fixed({100 + i: [DOG, DESK] for i in range(3)}, maps)
    out = tp.run_t2i(tmp_path / "img", tmp_path / "out", ["3d_spatial"], detector=fake, depth=fake)
    res = json.loads((tmp_path / "out" / "3d_spatial" / "annotation_obj_detection_3d" / "vqa_result.json").read_text())
    assert res == [{"question_id": 0, "answer": pytest.approx(0.65)},
                   {"question_id": 1, "answer": pytest.approx(0.35)}]
    cat = out["categories"]["3d_spatial"]
    assert cat["score"] == pytest.approx(0.5) and cat["n_images"] == 2 and cat["skipped_unparsed"] == 1
    assert fake.asked[0] == ["desk", "dog"]
    summary = json.loads((tmp_path / "out" / "t2i_summary.json").read_text())
    assert "protocol re-implementation" in summary["label"]
    bad = Fixed({100: [DOG, DESK]}, {100: DEPTH[:50]})
    with pytest.raises(ValueError, match="not the image size"):
        tp.score_prompt("3d_spatial", prompts[0], Image.new("RGB", (100, 100)), detector=bad, depth=bad)


def test_shipped_3d_spatial_prompts_all_parse():
    path = tp.Path(__file__).resolve().parents[2] / "data" / "t2i_compbench" / "3d_spatial_val.txt"
    prompts = [p for p in path.read_text().splitlines() if p.strip()]
    metas = [tp.parse_spatial_3d(p) for p in prompts]
    assert len(prompts) == 300 and all(metas)
    rels = [m["include"][1]["position"][0] for m in metas]
    assert (rels.count("in front of"), rels.count("behind"), rels.count("hidden")) == (102, 83, 115)


def test_dpt_depth_adapter_on_tiny_model(tmp_path):
    need("transformers", NEED_TRANSFORMERS)
    import transformers as tf

    from margrpo.eval.protocols.adapters import DepthEstimator

    torch.manual_seed(0)
    # ViT DPT, 4 layers of width 32 on 32 px / patch 8 (16 tokens); the 4 reassemble stages
    # read layers 0-3; predicted_depth comes out [1, 32, 32] (the head upsamples x2)
    cfg = tf.DPTConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3],
                       neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, head_in_index=-1)
    tf.DPTForDepthEstimation(cfg).save_pretrained(tmp_path / "dpt")
    tf.DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=False,
                         ensure_multiple_of=1).save_pretrained(tmp_path / "dpt")
    est = DepthEstimator(str(tmp_path / "dpt"), device="cpu")
    g = torch.Generator().manual_seed(0)
    img = Image.fromarray((torch.rand(45, 70, 3, generator=g) * 255).byte().numpy())
    d = est.depth(img)
    assert d.shape == (45, 70) and d.dtype == np.float32
    assert d.min() == pytest.approx(0.0) and d.max() == pytest.approx(1.0) and d.std() > 0
    # independently: the stock forward, resized and min-max normalised here
    with torch.no_grad():
        raw = est.model(**est.processor(images=img, return_tensors="pt")).predicted_depth
    up = torch.nn.functional.interpolate(raw[:, None], size=(45, 70), mode="bilinear", align_corners=True)[0, 0]
    np.testing.assert_allclose(d, ((up - up.min()) / (up.max() - up.min())).numpy(), atol=1e-5)
    flipped = DepthEstimator(str(tmp_path / "dpt"), device="cpu", larger_is_nearer=False).depth(img)
    np.testing.assert_allclose(flipped, 1.0 - d, atol=1e-6)
    # the driver takes the adapter: scores stay in [0, 1]
    s = tp.score_prompt("3d_spatial", "a dog behind a desk", img,
                        detector=Fixed({70: [Detection("dog", 0.9, (0, 0, 40, 40)),
                                             Detection("desk", 0.9, (10, 5, 70, 45))]}), depth=est)
    assert 0.45 <= s <= 0.95
    with pytest.raises(FileNotFoundError, match="depth_path"):
        DepthEstimator(str(tmp_path / "missing"))

"""The embedded world: grammar, splits, rendering."""
import json
import time

import pytest
import torch

from margrpo.jsonl import read_jsonl, write_jsonl
from margrpo.world import grammar as G
from margrpo.world import prompts as P
from margrpo.world.render import Scene, SceneObject, render


@pytest.mark.parametrize("text, match", [
    ("a round circle", "unknown word 'round'"),
    ("a circle and a circle", "different shapes"),
    ("a left circle", "unknown attribute 'left'"),
    ("a red large circle and a square", "canonical"),
    ("a striped circle", "colour only"),
    ("four circles and a square", "2x2 grid"),
])
def test_parse_errors(text, match):
    with pytest.raises(ValueError, match=match):
        G.parse_prompt(text)


def test_geneval_conventions():
    m = G.parse_prompt("three triangles")
    assert m["tag"] == "counting" and m["category"] is None
    assert m["include"] == [{"class": "triangle", "count": 3}]
    assert m["exclude"] == [{"class": "triangle", "count": 4}]
    m = G.parse_prompt("a circle left of a square")
    assert m["tag"] == "position"
    assert m["include"] == [{"class": "square", "count": 1},
                            {"class": "circle", "count": 1, "position": ["left of", 0]}]
    m = G.parse_prompt("a red circle and a blue square")
    assert (m["tag"], m["category"]) == ("color_attr", "color")
    m = G.parse_prompt("a striped red circle on the left of a small blue square")
    assert (m["tag"], m["category"]) == (None, "complex")
    assert G.parse_prompt("a red circle on the top of a blue square")["include"][1]["position"] == ["above", 0]


def test_every_combination_round_trips():
    for purpose in P.PURPOSES:
        for split in P.SPLITS:
            for m in P.combinations(purpose, split)[:200]:
                assert G.parse_prompt(m["prompt"]) == m
                assert len(m["prompt"].split()) <= 16  # model.max_prompt_len
                assert (m["tag"] or m["category"]) and m["category"] != "non_spatial"


def test_splits_disjoint_by_combination():
    for purpose in P.PURPOSES:
        train, held, test, novel = ({P.canonical_key(m) for m in P.combinations(purpose, s)}
                                    for s in ("train", "heldout", "test", "novel"))
        assert test and not (novel & (train | held | test) or test & (train | held) or train & held)
        if P.test_subset(purpose) == "test":
            assert train and held
        else:                                  # a test-only tag: nothing of it is trained or validated on
            assert purpose in P.TEST_ONLY and not (train or held)
    assert {p for p in P.PURPOSES if P.test_subset(p) == "unseen_tag"} == set(P.TEST_ONLY)
    tr = P.make_prompt_set("train", 30, seed=0)
    he = P.make_prompt_set("heldout", 30, seed=0)
    assert not {P.canonical_key(m) for m in tr} & {P.canonical_key(m) for m in he}
    assert P.split_of(he[0]) == "heldout" and P.split_of(tr[-1]) == "train"


def _bindings(meta):
    return {(r.get("color"), r["class"]) for r in meta["include"] if r.get("color")}


def test_committed_test_prompts_unseen():
    """The committed prompt files (prompts/world_*.jsonl, what the study reads): no test
    prompt's text occurs in the training or validation prompts; every GenEval tag and T2I
    category has >= 20 distinct headline test prompts (single_object: every shape); the
    test-only tags (single_object, two_object, counting) have no prompt in training or
    validation and are marked unseen_tag; the novel subset's colour-shape bindings occur in
    no training or validation prompt; and the files are what the params' seeds generate."""
    from margrpo.config import load_params

    files = {s: read_jsonl(f"prompts/world_{s}.jsonl") for s in ("train", "heldout", "test")}
    test, seen = files["test"], files["train"] + files["heldout"]
    texts = [m["prompt"] for m in test]
    assert len(set(texts)) == len(texts) >= 300
    assert not set(texts) & {m["prompt"] for m in seen}
    seen_keys = {P.canonical_key(m) for m in seen}
    assert not seen_keys & {P.canonical_key(m) for m in test}
    for tag in P.TEST_ONLY:
        assert not any(m["tag"] == tag for m in seen), tag
        assert {m["subset"] for m in test if m["tag"] == tag} == {"unseen_tag"}, tag
    headline = [m for m in test if m["subset"] != "novel"]
    for tag in G.GENEVAL_TAGS:
        n = len({m["prompt"] for m in headline if m["tag"] == tag})
        assert n >= (len(G.SHAPES) if tag == "single_object" else 20), (tag, n)
    assert {m["include"][0]["class"] for m in headline if m["tag"] == "single_object"} == set(G.SHAPES)
    for cat in G.T2I_CATEGORIES:
        assert len({m["prompt"] for m in headline if m["category"] == cat}) >= 20, cat
    seen_bindings = set().union(*(_bindings(m) for m in seen))
    assert not seen_bindings & set(P.NOVEL_PAIRS)
    for m in test:
        if m["subset"] == "novel":
            assert _bindings(m) & set(P.NOVEL_PAIRS)
    assert sum(m["subset"] == "novel" for m in test) >= 20

    w = load_params("params.yaml").world
    assert test == P.make_test_set(w.test_prompts_per_tag, w.novel_prompts_per_tag, w.seed + 2)
    assert files["train"] == P.make_prompt_set("train", w.train_prompts_per_tag, w.seed)
    assert files["heldout"] == P.make_prompt_set("heldout", w.heldout_prompts_per_tag, w.seed + 1)


def test_prompt_set_balanced_and_seeded(tmp_path):
    rows = P.make_prompt_set("train", 12, seed=3)
    tags = [m["tag"] for m in rows if m["tag"]]
    cats = [m["category"] for m in rows if m["category"]]
    assert all(tags.count(t) == (0 if t in P.TEST_ONLY else 12) for t in G.GENEVAL_TAGS)
    assert all(cats.count(c) == 12 for c in G.T2I_CATEGORIES)
    assert rows == P.make_prompt_set("train", 12, seed=3)
    assert rows != P.make_prompt_set("train", 12, seed=4)
    write_jsonl(rows, tmp_path / "p.jsonl")
    assert read_jsonl(tmp_path / "p.jsonl") == rows
    json.dumps(rows)


def test_same_seed_same_images():
    rows = P.make_prompt_set("train", 8, seed=0)
    a = render(P.sample_scenes(rows, torch.Generator().manual_seed(5)))
    b = render(P.sample_scenes(rows, torch.Generator().manual_seed(5)))
    c = render(P.sample_scenes(rows, torch.Generator().manual_seed(6)))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_render_basics():
    scene = Scene([SceneObject("square", "red", "solid", "large", (0, 1)),
                   SceneObject("circle", "blue", "striped", "small", (1, 0), (2, -2))])
    img = render([scene, Scene()], size=32)
    assert img.shape == (2, 3, 32, 32) and img.dtype == torch.float32
    assert img.min() >= 0 and img.max() <= 1
    assert torch.all(img[1] == 1)                          # empty scene: white
    assert torch.all(img[0, :, :16, :16] == 1)             # empty cell stays white
    assert torch.allclose(img[0, :, 8, 24], torch.tensor([0.9, 0.1, 0.1]))
    stripes = img[0, 2, 16:32, 6]                          # blue channel down the circle
    assert stripes.min() < 0.5 < stripes.max()             # both shades present
    assert render([scene], size=64).shape == (1, 3, 64, 64)
    with pytest.raises(ValueError, match="even"):
        render([scene], size=33)


def test_objects_respect_layout():
    rows = [G.parse_prompt("a circle left of a square"), G.parse_prompt("a circle above a square")]
    for scene in P.sample_scenes(rows * 20, torch.Generator().manual_seed(0)):
        circle = next(o for o in scene.objects if o.shape == "circle")
        square = next(o for o in scene.objects if o.shape == "square")
        assert (circle.cell[0] == square.cell[0] and circle.cell[1] < square.cell[1]) or \
               (circle.cell[1] == square.cell[1] and circle.cell[0] < square.cell[0])


def test_render_speed():
    scenes = P.sample_scenes(P.make_prompt_set("train", 24, seed=0)[:256], torch.Generator().manual_seed(0))
    render(scenes)
    t = time.perf_counter()
    render(scenes)
    assert time.perf_counter() - t < 0.05


def test_images_allocated_per_tag_and_folded_per_prompt():
    from margrpo.world.generate import allocate_images, fold_rows

    metas = ([{"tag": "single_object", "subset": "unseen_tag"}] * 2 + [{"tag": "colors", "subset": "test"}] * 10
             + [{"tag": "colors", "subset": "novel"}, {"tag": None, "category": "shape", "subset": "test"}])
    counts = allocate_images(metas, 2, 40)
    assert counts == [20, 20] + [4] * 10 + [2, 2]          # >= 40 images per tag, whole multiples of 2
    assert allocate_images(metas, 2, 0) == [2] * len(metas)
    assert fold_rows({"geneval": [1.0, 0.0, 0.5, None]}, [3, 1]) == {"geneval": [0.5, None]}
    assert fold_rows({"t2i": [None, None, 0.25]}, [2, 1]) == {"t2i": [None, 0.25]}

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
        assert train and held and test and not (train & held or novel & (train | held | test))
        if P.test_subset(purpose) == "test":   # never trained on
            assert not test & (train | held)
        else:                                  # too small a space: the whole pool, marked reused
            assert test == train | held
    tr = P.make_prompt_set("train", 30, seed=0)
    he = P.make_prompt_set("heldout", 30, seed=0)
    assert not {P.canonical_key(m) for m in tr} & {P.canonical_key(m) for m in he}
    assert P.split_of(he[0]) == "heldout" and P.split_of(tr[-1]) == "train"


def _bindings(meta):
    return {(r.get("color"), r["class"]) for r in meta["include"] if r.get("color")}


def test_test_split_decides():
    """The study's test split (params.yaml's world keys): >= 300 distinct prompts, >= 10
    distinct per GenEval tag and T2I category (single_object: every shape), disjoint from
    training and validation at the prompt and the combination level except the marked
    reused prompts, and a novel subset whose colour-shape bindings no training or
    validation prompt has."""
    from margrpo.config import load_params

    w = load_params("params.yaml").world
    test = P.make_test_set(w.test_prompts_per_tag, w.novel_prompts_per_tag, w.seed + 2)
    texts = [m["prompt"] for m in test]
    assert len(set(texts)) == len(texts) >= 300
    seen = [m for s in ("train", "heldout") for purpose in P.PURPOSES for m in P.combinations(purpose, s)]
    seen_texts = {m["prompt"] for m in seen}
    seen_keys = {P.canonical_key(m) for m in seen}
    seen_bindings = set().union(*(_bindings(m) for m in seen))
    headline = [m for m in test if m["subset"] != "novel"]
    for tag in G.GENEVAL_TAGS:
        n = len({m["prompt"] for m in headline if m["tag"] == tag})
        assert n >= (len(G.SHAPES) if tag == "single_object" else 10), (tag, n)
    assert {m["include"][0]["class"] for m in headline if m["tag"] == "single_object"} == set(G.SHAPES)
    for cat in G.T2I_CATEGORIES:
        assert len({m["prompt"] for m in headline if m["category"] == cat}) >= 10, cat
    for m in test:
        key = P.canonical_key(m)
        if m["subset"] == "reused":
            assert key in seen_keys
        else:
            assert key not in seen_keys and m["prompt"] not in seen_texts
        if m["subset"] == "novel":
            novel = _bindings(m) & set(P.NOVEL_PAIRS)
            assert novel and not novel & seen_bindings
    assert not seen_bindings & set(P.NOVEL_PAIRS)
    assert sum(m["subset"] == "novel" for m in test) >= 20


def test_prompt_set_balanced_and_seeded(tmp_path):
    rows = P.make_prompt_set("train", 12, seed=3)
    tags = [m["tag"] for m in rows if m["tag"]]
    cats = [m["category"] for m in rows if m["category"]]
    assert all(tags.count(t) == 12 for t in G.GENEVAL_TAGS)
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

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
        train, held, test = ({P.canonical_key(m) for m in P.combinations(purpose, s)}
                             for s in ("train", "heldout", "test"))
        assert train and held and test and not (train & held or train & test or held & test)
    tr = P.make_prompt_set("train", 30, seed=0)
    he = P.make_prompt_set("heldout", 30, seed=0)
    assert not {P.canonical_key(m) for m in tr} & {P.canonical_key(m) for m in he}
    assert P.split_of(he[0]) == "heldout" and P.split_of(tr[-1]) == "train"


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

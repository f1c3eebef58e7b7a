"""The embedded world: grammar, tokenizer, splits, rendering."""
import json
import time

import pytest
import torch

from margrpo.world import grammar as G
from margrpo.world import prompts as P
from margrpo.world.render import Scene, SceneObject, render


def test_vocab_and_tokenize():
    assert G.VOCAB[G.PAD_ID] == "<pad>" and G.VOCAB[G.NULL_ID] == "<null>"
    ids = G.tokenize("a red circle left of a square")
    assert len(ids) == 16 and ids[7:] == [G.PAD_ID] * 9
    assert G.detokenize(ids) == "a red circle left of a square"
    assert G.tokenize("") == [G.NULL_ID] + [G.PAD_ID] * 15


def test_tokenize_errors():
    with pytest.raises(ValueError, match="'dog'.*vocabulary"):
        G.tokenize("a dog")
    with pytest.raises(ValueError, match="max_len=4"):
        G.tokenize("a red circle and a square", max_len=4)


def test_parse_errors():
    with pytest.raises(ValueError, match="unknown word 'round'"):
        G.parse_prompt("a round circle")
    with pytest.raises(ValueError, match="different shapes"):
        G.parse_prompt("a circle and a circle")
    with pytest.raises(ValueError, match="unknown attribute 'left'"):
        G.parse_prompt("a left circle")
    with pytest.raises(ValueError, match="canonical"):
        G.parse_prompt("a red large circle and a square")
    with pytest.raises(ValueError, match="colour only"):
        G.parse_prompt("a striped circle")
    with pytest.raises(ValueError, match="2x2 grid"):
        G.parse_prompt("four circles and a square")


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
                assert len(G.tokenize(m["prompt"])) == 16
                assert (m["tag"] or m["category"]) and m["category"] != "non_spatial"


def test_splits_disjoint_by_combination():
    for purpose in P.PURPOSES:
        train = {P.canonical_key(m) for m in P.combinations(purpose, "train")}
        held = {P.canonical_key(m) for m in P.combinations(purpose, "heldout")}
        assert train and held and not train & held
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
    P.write_jsonl(rows, tmp_path / "p.jsonl")
    assert P.read_jsonl(tmp_path / "p.jsonl") == rows
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

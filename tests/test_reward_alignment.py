"""The `aligned` training reward is ordered like the evaluation it trains for (issue 17):
its maximum (1) needs a GenEval-correct image with nothing unrequested, and dropping or
changing a named attribute, a missing or extra object, a wrong count or a broken relation
always lowers it. Checked on rendered pairs (the right scene and the same prompt's scene
with one thing wrong) for every GenEval tag and T2I-CompBench category of the world."""
from __future__ import annotations

import torch

from margrpo.world import prompts as P
from margrpo.world.evaluator import WorldEvaluator
from margrpo.world.grammar import SHAPES, parse_prompt
from margrpo.world.render import Scene, SceneObject, render

PER_PURPOSE = 6


def _extra_object(scene: Scene, meta: dict, gen: torch.Generator) -> Scene | None:
    """The scene plus one object of a shape the prompt does not name, in a free cell."""
    free = [(r, c) for r in (0, 1) for c in (0, 1) if (r, c) not in {o.cell for o in scene.objects}]
    unused = [s for s in SHAPES if s not in {r["class"] for r in meta["include"]}]
    if not free or not unused:
        return None
    cell = free[int(torch.randint(len(free), (1,), generator=gen))]
    extra = SceneObject(shape=unused[0], color="green", texture="solid", size="large", cell=cell)
    return Scene(objects=[*scene.objects, extra])


def test_aligned_reward_is_maximal_only_when_right_and_lower_for_every_corruption():
    gen = torch.Generator().manual_seed(0)
    ev = WorldEvaluator()
    checked = {}
    for purpose in P.PURPOSES:
        metas = P.combinations(purpose, "train") or P.combinations(purpose, "test")   # test-only tags
        metas = [metas[int(i)] for i in torch.randperm(len(metas), generator=gen)[:PER_PURPOSE]]
        for meta in metas:
            right = P.sample_scenes([meta], gen)[0]
            variants = {kind: P.corrupt_scene(meta, kind, gen) for kind in P.CORRUPTIONS}
            variants["extra_object"] = _extra_object(right, meta, gen)
            variants = {k: v for k, v in variants.items() if v is not None}
            s = ev.score(render([right, *variants.values()]), [meta] * (1 + len(variants)))
            aligned = s["aligned"]
            # the render of the prompt is GenEval-correct with nothing extra: the maximum
            assert aligned[0] == 1.0, (meta["prompt"], s["reasons"][0])
            for (kind, _), value in zip(variants.items(), aligned[1:].tolist()):
                assert value < aligned[0], (meta["prompt"], kind, value)
                checked[(purpose, kind)] = checked.get((purpose, kind), 0) + 1
    # every purpose met the corruptions that apply to it (colour, count, relation, ...)
    kinds = {k for _, k in checked}
    assert kinds == set(P.CORRUPTIONS) | {"extra_object"}
    assert {p for p, _ in checked} == set(P.PURPOSES)


def test_aligned_reward_is_dense_on_imperfect_images():
    """Half of it is the share of requirements met, so a wrong image still scores above 0
    when part of the prompt is right: groups of a tiny model keep a spread."""
    meta = parse_prompt("a red circle and a blue square")
    gen = torch.Generator().manual_seed(1)
    wrong = P.corrupt_scene(meta, "wrong_color", gen)
    missing = P.corrupt_scene(meta, "missing_object", gen)
    s = WorldEvaluator().score(render([wrong, missing]), [meta, meta])
    assert (s["aligned"] > 0).all() and (s["aligned"] < 0.5).all()
    assert (s["geneval"] == 0).all()

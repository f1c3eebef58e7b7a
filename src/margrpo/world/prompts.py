"""Prompt sets, train / validation / test splits and scene sampling (files: margrpo.jsonl).

Splits are disjoint in combinations, not seeds: every purpose (GenEval tag or T2I
category, see grammar.purpose_of) has a finite set of combinations (metadata without the
prompt text). Each combination gets a stable SHA-256 hash of its canonical JSON, so a
combination is in the same split on every machine and Python version.

- Novel bindings (NOVEL_PAIRS): one colour per shape is never bound to that shape in a
  training or validation prompt ("a purple triangle" appears in no such prompt, though
  purple and triangles do). Every combination that binds one is in the test split only,
  subset "novel": compositional generalisation, reported apart.
- Test-only tags (TEST_ONLY): single_object, two_object and counting have 8, 56 and 24
  combinations, too few to give both a training pool and >= MIN_TEST unseen test prompts;
  as GenEval meets a real model, none of their prompts is trained on, validated on or
  pretrained on, and their whole pool is the test split (subset "unseen_tag"). A purpose
  whose split below would leave too little to train on is test-only in the same way.
- Of the other combinations of a purpose (N of them), the VALIDATION_FRACTION with the
  lowest hashes (at least one) are held out for validation ("heldout": selection of the
  best checkpoint during training). The test split takes the next max(MIN_TEST,
  TEST_FRACTION N) (subset "test", never trained on), leaving at least
  MIN_TRAIN_FRACTION of the purpose for training.
- The test prompt set (make_test_set) lists each test combination once, at most
  `per_tag` per purpose and subset, so its headline numbers rest on distinct prompts.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import zlib
from functools import lru_cache
from typing import Any

import torch

from margrpo.world.grammar import (COLORS, GENEVAL_TAGS, MAX_OBJECTS, RELATIONS, SHAPES,
                                   SIZES, T2I_CATEGORIES, TEXTURES, make_meta)
from margrpo.world.render import Scene, SceneObject, max_jitter

VALIDATION_FRACTION = 0.2
TEST_FRACTION = 0.25
MIN_TEST = 20
MIN_TRAIN_FRACTION = 0.4
TEST_ONLY = ("single_object", "two_object", "counting")
# (colour, shape) bindings no training or validation prompt names: one colour per shape.
NOVEL_PAIRS = (("cyan", "circle"), ("green", "square"), ("purple", "triangle"), ("yellow", "diamond"),
               ("orange", "ring"), ("pink", "cross"), ("blue", "semicircle"), ("red", "rectangle"))
# One pool per purpose. T2I "color" has no pool of its own: its prompts are the
# color_attr prompts (same text, both labels), so balancing over PURPOSES gives every
# tag and every category n_per_tag prompts.
PURPOSES = GENEVAL_TAGS + tuple(c for c in T2I_CATEGORIES if c != "color")
SPLITS = ("train", "heldout", "test", "novel")
TEST_SUBSETS = ("test", "unseen_tag", "novel")
CORRUPTIONS = ("wrong_color", "wrong_shape", "wrong_count", "swapped_relation",
               "missing_object", "wrong_texture", "wrong_size")


def canonical_key(meta: dict[str, Any]) -> str:
    body = {k: meta.get(k) for k in ("tag", "category", "include", "exclude")}
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _hash(meta: dict[str, Any]) -> int:
    return int.from_bytes(hashlib.sha256(canonical_key(meta).encode()).digest()[:8], "big")


def _pairs():
    return list(itertools.permutations(SHAPES, 2))


def _attr_options(max_attrs: int) -> list[dict[str, str]]:
    """Attribute dicts with 1..max_attrs of size / texture / colour."""
    out = []
    for size, tex, col in itertools.product((None,) + SIZES, (None,) + TEXTURES, (None,) + tuple(COLORS)):
        d = {k: v for k, v in (("size", size), ("texture", tex), ("color", col)) if v}
        if 1 <= len(d) <= max_attrs:
            out.append(d)
    return out


def _obj(shape: str, count: int = 1, **attrs) -> dict[str, Any]:
    return {"class": shape, "count": count, **attrs}


def _rel(a: dict, b: dict, rel: str, style: str) -> dict[str, Any]:
    """"A rel B" in GenEval order: B first, A carries the position."""
    return make_meta([b, {**a, "position": [rel, 0]}], style)


def _enumerate(purpose: str) -> list[dict[str, Any]]:
    colors = tuple(COLORS)
    if purpose == "single_object":
        return [make_meta([_obj(s)]) for s in SHAPES]
    if purpose == "two_object":
        return [make_meta([_obj(a), _obj(b)]) for a, b in _pairs()]
    if purpose == "counting":
        return [make_meta([_obj(s, n)]) for s in SHAPES for n in (2, 3, 4)]
    if purpose == "colors":
        return [make_meta([_obj(s, color=c)]) for s in SHAPES for c in colors]
    if purpose == "position":
        return [_rel(_obj(a), _obj(b), r, "geneval") for a, b in _pairs() for r in RELATIONS]
    if purpose == "color_attr":
        return [make_meta([_obj(a, color=ca), _obj(b, color=cb)])
                for a, b in _pairs() for ca, cb in itertools.permutations(colors, 2)]
    if purpose in ("shape", "texture"):
        key, values = ("size", SIZES) if purpose == "shape" else ("texture", TEXTURES)
        return [make_meta([_obj(a, **{key: va}), _obj(b, **{key: vb})])
                for a, b in _pairs() for va, vb in itertools.product(values, values)]
    if purpose == "spatial":
        out = [_rel(_obj(a), _obj(b), r, "t2i") for a, b in _pairs() for r in RELATIONS]
        out += [_rel(_obj(a, color=ca), _obj(b, color=cb), r, "t2i") for a, b in _pairs()
                for r in RELATIONS for ca, cb in itertools.permutations(colors, 2)]
        return out
    if purpose == "complex":
        # Each phrase carries one or two attributes; keep only combinations that are not
        # already a simpler category (colour-only relations are spatial, etc.).
        opts = _attr_options(2)
        names = [str(sorted(o.items())) for o in opts]
        out = []
        for (a, b), (ia, oa), (ib, ob) in itertools.product(_pairs(), enumerate(opts), enumerate(opts)):
            for rel in (None,) + RELATIONS:
                if not _keep_complex(f"{a}|{b}|{names[ia]}|{names[ib]}|{rel}"):
                    continue
                m = make_meta([_obj(a, **oa), _obj(b, **ob)]) if rel is None else \
                    _rel(_obj(a, **oa), _obj(b, **ob), rel, "t2i")
                if m["category"] == "complex":
                    out.append(m)
        return out
    if purpose == "numeracy":
        counts = [(2, 1), (1, 2), (3, 1), (1, 3), (2, 2)]
        return [make_meta([_obj(a, ca), _obj(b, cb)]) for a, b in _pairs() for ca, cb in counts]
    raise ValueError(f"unknown purpose {purpose!r}; purposes: {', '.join(PURPOSES)}")


# The complex space is ~650k combinations (56 shape pairs x 48^2 attribute sets x 5
# relations); enumerating it all takes ~40 s at every start, so the purpose keeps a fixed
# 1/COMPLEX_KEEP of it, chosen by a checksum of the combination's parts (~10k, ~2 s).
COMPLEX_KEEP = 64


def _keep_complex(key: str) -> bool:
    """key: "shape|shape|attributes|attributes|relation"; CRC-32 is stable across runs and machines."""
    return zlib.crc32(key.encode()) % COMPLEX_KEEP == 0


def binds_novel(meta: dict[str, Any]) -> bool:
    """Whether a prompt binds a colour to a shape that training never binds (NOVEL_PAIRS)."""
    return any((r.get("color"), r["class"]) in NOVEL_PAIRS for r in meta["include"])


@lru_cache(maxsize=None)
def _split_pools(purpose: str) -> dict[str, Any]:
    """{"heldout", "train", "test", "novel": combinations as JSON strings, "test_subset":
    "test" or "unseen_tag"} for one purpose (module docstring)."""
    metas = sorted(_enumerate(purpose), key=_hash)
    novel = [m for m in metas if binds_novel(m)]
    pool = [m for m in metas if not binds_novel(m)]
    n = len(pool)
    n_val = max(1, math.ceil(VALIDATION_FRACTION * n))
    n_test = max(MIN_TEST, math.ceil(TEST_FRACTION * n))
    as_json = [json.dumps(m) for m in pool]
    out = {"novel": tuple(json.dumps(m) for m in novel)}
    if purpose not in TEST_ONLY and n - n_val - n_test >= MIN_TRAIN_FRACTION * n:
        out.update(heldout=tuple(as_json[:n_val]), test=tuple(as_json[n_val:n_val + n_test]),
                   train=tuple(as_json[n_val + n_test:]), test_subset="test")
    else:
        out.update(heldout=(), test=tuple(as_json), train=(), test_subset="unseen_tag")
    return out


def combinations(purpose: str, split: str) -> list[dict[str, Any]]:
    """All combinations of a purpose in a split (fresh dicts, stable order). The test split
    of a test-only purpose holds its whole pool, its other splits nothing (test_subset)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [json.loads(s) for s in _split_pools(purpose)[split]]


def test_subset(purpose: str) -> str:
    """"unseen_tag" for a test-only purpose (no prompt of it is trained on), else "test"
    (its test combinations are never trained on, its others are)."""
    return _split_pools(purpose)["test_subset"]


@lru_cache(maxsize=None)
def _split_by_key(purpose: str) -> dict[str, str]:
    pools = _split_pools(purpose)
    return {canonical_key(json.loads(m)): split for split in ("test", "novel", "heldout", "train")
            for m in pools[split]}


def split_of(meta: dict[str, Any]) -> str:
    """The split a combination belongs to."""
    purpose = meta["tag"] if meta.get("tag") else meta["category"]
    split = _split_by_key(purpose).get(canonical_key(meta))
    if split is None:
        raise ValueError(f"{meta.get('prompt')!r} is not a combination of purpose {purpose!r}")
    return split


def make_prompt_set(split: str, n_per_tag: int, seed: int) -> list[dict[str, Any]]:
    """n_per_tag prompts for every purpose with combinations in the split (so n per GenEval
    tag and per T2I category; test-only tags have none in train and heldout), drawn
    without replacement; a purpose with fewer combinations than n_per_tag cycles through
    fresh permutations of its pool, so small pools repeat prompts."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for purpose in PURPOSES:
        pool = combinations(purpose, split)
        if not pool:
            continue
        picks: list[int] = []
        while len(picks) < n_per_tag:
            picks += torch.randperm(len(pool), generator=gen).tolist()
        out += [dict(pool[i]) for i in picks[:n_per_tag]]
    return out


def make_test_set(per_tag: int, novel_per_tag: int, seed: int) -> list[dict[str, Any]]:
    """The test prompts: per purpose, up to per_tag distinct test combinations (all of a
    test-only purpose's pool up to that cap) and up to novel_per_tag distinct novel ones,
    each once, with "subset" set to test / unseen_tag / novel. Drawn from the pools in a
    seeded random order."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for purpose in PURPOSES:
        for split, cap, subset in (("test", per_tag, test_subset(purpose)), ("novel", novel_per_tag, "novel")):
            pool = combinations(purpose, split)
            order = torch.randperm(len(pool), generator=gen).tolist()[:cap]
            out += [{**pool[i], "subset": subset} for i in order]
    return out


# ---------------------------------------------------------------- scene sampling


def _choice(options, gen: torch.Generator):
    return options[int(torch.randint(len(options), (1,), generator=gen))]


def _objects_for(meta: dict[str, Any], gen: torch.Generator) -> list[tuple[int, dict[str, str]]]:
    """(include index, attributes) per object; attributes the prompt leaves free are random."""
    objs = []
    for i, req in enumerate(meta["include"]):
        for _ in range(req["count"]):
            objs.append((i, {
                "shape": req["class"],
                "color": req.get("color") or _choice(tuple(COLORS), gen),
                "texture": req.get("texture") or _choice(TEXTURES, gen),
                "size": req.get("size") or _choice(SIZES, gen),
            }))
    return objs


def _relation_cells(rel: str, gen: torch.Generator) -> tuple[tuple[int, int], tuple[int, int]]:
    """(cell of A, cell of B) for "A rel B": same row for left/right, same column otherwise."""
    k = int(torch.randint(2, (1,), generator=gen))
    return {"left of": ((k, 0), (k, 1)), "right of": ((k, 1), (k, 0)),
            "above": ((0, k), (1, k)), "below": ((1, k), (0, k))}[rel]


def _place(meta, objs, gen, size: int, swap: bool = False) -> Scene:
    if len(objs) > MAX_OBJECTS:
        raise ValueError(f"{len(objs)} objects do not fit the 2x2 grid")
    inc = meta["include"]
    rel = inc[1].get("position") if len(inc) == 2 else None
    cells = [divmod(int(c), 2) for c in torch.randperm(4, generator=gen)[: len(objs)]]
    present = {i for i, _ in objs}
    if rel is not None and present == {0, 1} and len(objs) == 2:
        cell_a, cell_b = _relation_cells(rel[0], gen)
        if swap:
            cell_a, cell_b = cell_b, cell_a
        cells = [cell_a if i == 1 else cell_b for i, _ in objs]
    scene = Scene()
    for (_, attrs), cell in zip(objs, cells):
        j = max_jitter(size, attrs["size"])
        jit = torch.randint(-j, j + 1, (2,), generator=gen).tolist()
        scene.objects.append(SceneObject(cell=tuple(cell), jitter=tuple(jit), **attrs))
    return scene


def sample_scenes(metadata_list: list[dict[str, Any]], generator: torch.Generator,
                  size: int = 32) -> list[Scene]:
    """One scene per prompt that satisfies it (only the named objects are drawn)."""
    return [_place(m, _objects_for(m, generator), generator, size) for m in metadata_list]


def corrupt_scene(meta: dict[str, Any], kind: str, generator: torch.Generator,
                  size: int = 32) -> Scene | None:
    """A scene that violates the prompt in one way, or None where `kind` does not apply
    (e.g. wrong_color on a prompt that names no colour). Kinds: CORRUPTIONS."""
    gen = generator
    objs = _objects_for(meta, gen)
    inc = meta["include"]
    swap = False
    if kind in ("wrong_color", "wrong_texture", "wrong_size"):
        attr = kind.split("_")[1]
        idx = [i for i, r in enumerate(inc) if attr in r]
        if not idx:
            return None
        values = {"color": tuple(COLORS), "texture": TEXTURES, "size": SIZES}[attr]
        target = inc[idx[0]][attr]
        other = _choice([v for v in values if v != target], gen)
        objs = [(i, {**a, attr: other}) if i == idx[0] else (i, a) for i, a in objs]
    elif kind == "wrong_shape":
        unused = [s for s in SHAPES if s not in {r["class"] for r in inc}]
        new = _choice(unused, gen)
        objs = [(i, {**a, "shape": new}) if i == 0 else (i, a) for i, a in objs]
    elif kind == "wrong_count":
        if not meta.get("exclude"):
            return None  # without an exclude clause extra objects are allowed
        i0 = next(i for i, r in enumerate(inc) if r["count"] > 1)
        if len(objs) < MAX_OBJECTS:
            objs.append(next(o for o in objs if o[0] == i0))
        else:
            objs.remove(next(o for o in objs if o[0] == i0))
    elif kind == "swapped_relation":
        if not (len(inc) == 2 and "position" in inc[1]):
            return None
        swap = True
    elif kind == "missing_object":
        objs.pop(int(torch.randint(len(objs), (1,), generator=gen)))
    else:
        raise ValueError(f"unknown corruption {kind!r}; kinds: {', '.join(CORRUPTIONS)}")
    return _place(meta, objs, gen, size, swap=swap)

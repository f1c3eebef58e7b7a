"""The shared helpers: JSON-lines I/O with errors that name file and line, mean / std."""
from __future__ import annotations

import math

import pytest

from margrpo.jsonl import JsonlError, read_jsonl, write_jsonl
from margrpo.stats import aggregate, expected_max, mean_std, mean_var


def test_jsonl_round_trip_skips_blank_lines(tmp_path):
    rows = [{"prompt": "a red circle", "tag": "colors"}, {"prompt": "ünïcode"}]
    write_jsonl(rows, tmp_path / "sub" / "p.jsonl")
    assert read_jsonl(tmp_path / "sub" / "p.jsonl") == rows
    (tmp_path / "b.jsonl").write_text('{"a": 1}\n\n   \n{"a": 2}\n')
    assert read_jsonl(tmp_path / "b.jsonl") == [{"a": 1}, {"a": 2}]
    assert not list(tmp_path.glob("sub/.*.tmp")), "the temporary file is renamed into place"


@pytest.mark.parametrize("content, where, what", [
    (b'{"a": 1}\n{"a": 2,}\n', ":2:", "not valid JSON"),
    (b'{"a": 1}\n\n{"a": "\xff"}\n', ":3:", "not UTF-8"),
    (b'{"a": 1}\n[1, 2]\n', ":2:", "expected an object"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, content, where, what):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    with pytest.raises(JsonlError) as err:
        read_jsonl(path)
    assert f"prompts.jsonl{where}" in str(err.value) and what in str(err.value)


def test_jsonl_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_jsonl(tmp_path / "nope.jsonl")


def test_mean_std_and_var():
    m, sd, n = mean_std([1.0, 2.0, 4.0])
    assert (m, n) == (7 / 3, 3) and sd == pytest.approx(math.sqrt(((4 / 3) ** 2 + (1 / 3) ** 2 + (5 / 3) ** 2) / 2))
    assert mean_var([1.0, 2.0, 4.0])[1] == pytest.approx(sd**2)
    assert mean_std([5.0]) == (5.0, 0.0, 1) and math.isnan(mean_var([5.0])[1])
    with pytest.raises(ValueError):
        mean_std([])


def test_aggregate_skips_non_finite_and_missing():
    agg = aggregate([{"a": 1.0, "b": math.nan}, {"a": 3.0}, {"a": 2.0, "c": math.inf}])
    assert agg["mean"] == {"a": 2.0} and agg["n"] == {"a": 3} and agg["std"]["a"] == pytest.approx(1.0)


def test_expected_max_matches_enumeration_and_pass_at_k():
    import itertools
    import random

    rng = random.Random(0)
    xs = [rng.random() for _ in range(7)]
    for k in range(1, 8):
        subsets = list(itertools.combinations(xs, k))
        assert expected_max(xs, k) == pytest.approx(sum(max(s) for s in subsets) / len(subsets))
    assert expected_max(xs, 1) == pytest.approx(sum(xs) / len(xs))
    hits = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # c = 2 of n = 8: pass@4 = 1 - C(6,4)/C(8,4)
    assert expected_max(hits, 4) == pytest.approx(1 - 15 / 70)
    with pytest.raises(ValueError, match="k=9 with n=8"):
        expected_max(hits, 9)

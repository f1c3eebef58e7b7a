"""The time `dvc repro` announces for a fresh clone (pipeline/validate.py): whole committed
runs per seed, so that warm-up and gradient-probe steps count."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from margrpo.config import load_params
from pipeline import common, validate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def reports(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "REPORTS", tmp_path)
    (tmp_path / "train" / "grpo").mkdir(parents=True)
    (tmp_path / "eval" / "grpo").mkdir(parents=True)
    # A final window that saw only plain 10-s steps; no evaluation time.
    (tmp_path / "train" / "grpo" / "metrics.json").write_text(json.dumps({"final_window": {"mean": {"time/step": 10.0}}}))
    (tmp_path / "eval" / "grpo" / "metrics.json").write_text(json.dumps({"time/eval_s": 0.0, "images": 1}))
    return tmp_path


def test_estimate_counts_whole_runs_with_probe_steps(reports):
    params = load_params(ROOT / "params.yaml", {"train.steps": 4, "train.seeds": [0, 1]})
    start = validate.STAGE_START_S * 3 / 60
    # No histories: the final window's 10 s per step, 4 steps x 2 seeds.
    assert validate.estimate_minutes(params, ["grpo"]) == pytest.approx(start + 80 / 60)
    # Seed histories with a 30-s first step and a 50-s probe step: 140 s over 8 steps.
    for seed, times in (("seed0", [30, 10, 10, 10]), ("seed1", [10, 50, 10, 10])):
        path = reports / "train" / "grpo" / "seeds" / seed / "history.jsonl"
        path.parent.mkdir(parents=True)
        path.write_text("".join(json.dumps({"step": i + 1, "time/step": t}) + "\n" for i, t in enumerate(times)))
    assert validate.estimate_minutes(params, ["grpo"]) == pytest.approx(start + 140 / 60)


def test_estimate_scales_with_a_methods_steps_factor(reports):
    params = load_params(ROOT / "params.yaml", {"train.steps": 4, "train.seeds": [0, 1],
                                                "methods.grpo.steps_factor": 3})
    start = validate.STAGE_START_S * 3 / 60
    assert validate.estimate_minutes(params, ["grpo"]) == pytest.approx(start + 3 * 80 / 60)


def test_a_method_without_measured_times_is_timed_as_the_slowest_measured_one(reports):
    """posterior has no committed records here: it counts as grpo's 80 s, the only measured
    method; with no measured method at all the time is unknown."""
    params = load_params(ROOT / "params.yaml", {"train.steps": 4, "train.seeds": [0, 1]})
    start = validate.STAGE_START_S * 5 / 60
    assert validate.estimate_minutes(params, ["grpo", "posterior"]) == pytest.approx(start + 2 * 80 / 60)
    assert validate.estimate_minutes(params, ["posterior"]) is None

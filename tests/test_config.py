"""params.yaml validation: the shipped files validate, and a bad file fails with one error
that names the offending key; dvc.yaml's params lists name real keys."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from margrpo.config import ParamsError, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def shipped() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def with_change(dotted: str, value) -> dict:
    raw = shipped()
    node = raw
    *parents, leaf = dotted.split(".")
    for p in parents:
        node = node[p]
    node[leaf] = value
    return raw


def test_shipped_params_validate():
    params = load_params(ROOT / "params.yaml")
    assert set(params.methods) >= {"grpo", "mar_grpo"}
    assert params.method("grpo").k == 1.0, "vanilla GRPO must not read the ablation keys"
    assert params.method("mar_grpo").k == params.k


def test_quick_profile_validates():
    from pipeline.profile import merge

    quick = yaml.safe_load((ROOT / "params_quick.yaml").read_text())
    params = parse_params(merge(shipped(), quick))
    assert params.train.seeds == [0]


@pytest.mark.parametrize("dotted, value, expect", [
    ("train.steps", "sixty", "train.steps"),          # wrong type
    ("k", 1.5, "k"),                                  # out of range
    ("train.stepz", 10, "train.stepz"),               # unknown key
    ("evaluate.images_per_prompt", 0, "evaluate.images_per_prompt"),
    ("methods.mar_grpo.estimator", "magic", "methods.mar_grpo.estimator"),
    ("train.loss_head_window", 3, "train.loss_head_window"),    # fewer than loss_head_steps
    ("train.loss_head_window", 99, "train.loss_head_window"),   # more than sampling.head_steps
    ("model.flow_shift", 0, "model.flow_shift"),
])
def test_bad_params_name_the_key(dotted, value, expect):
    with pytest.raises(ParamsError) as err:
        parse_params(with_change(dotted, value))
    message = str(err.value)
    assert expect in message
    assert message.count("\n  ") == 1, f"expected exactly one error line:\n{message}"


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "params.yaml")


def _stage_params(stage: dict) -> list[str]:
    out = []
    for entry in stage.get("params", []):
        out += [entry] if isinstance(entry, str) else [k for keys in entry.values() for k in keys]
    return out


def test_dvc_params_exist_and_ablation_keys_reach_only_mar_grpo():
    """Every key a stage lists exists in params.yaml, and only train@mar_grpo lists k."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    raw = shipped()
    for name, stage in dvc["stages"].items():
        if "foreach" in stage:
            continue
        for key in _stage_params(stage):
            node = raw
            for part in key.split("."):
                assert part in node, f"stage {name} lists params key {key!r}, not in params.yaml"
                node = node[part]
    train = dvc["stages"]["train"]
    for method, item in train["foreach"].items():
        assert method in raw["methods"]
        reads_ablation = set(item["ablation"]) == {"k", "tau", "num_trajectories"}
        assert reads_ablation == raw["methods"][method].get("uses_ablation_keys", False)
    assert "k" not in _stage_params(dvc["stages"]["evaluate"]["do"])

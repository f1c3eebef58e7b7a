"""params.yaml validation: the shipped files validate; dvc.yaml's params lists name real
keys. Malformed input: tests/test_params_errors.py."""
from __future__ import annotations

from pathlib import Path

import yaml

from margrpo.config import load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]


def shipped() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


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


def _stage_params(stage: dict) -> list[str]:
    out = []
    for entry in stage.get("params", []):
        out += [entry] if isinstance(entry, str) else [k for keys in entry.values() for k in keys]
    return out


def test_dvc_params_exist_and_ablation_keys_reach_only_the_methods_that_read_them():
    """Every key a stage lists exists in params.yaml; a method's train stage lists the
    top-level ablation keys only if the method reads them (uses_ablation_keys), and k only
    if it ranks tokens by uncertainty (topk)."""
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
        listed = set(item["ablation"]) & {"k", "tau", "num_trajectories"}
        assert bool(listed) == raw["methods"][method].get("uses_ablation_keys", False), method
        assert ("k" in listed) == raw["methods"][method].get("topk", False), method
    assert "k" not in _stage_params(dvc["stages"]["evaluate"]["do"])

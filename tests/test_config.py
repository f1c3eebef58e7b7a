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


def test_dvc_params_exist():
    """Every key a stage of dvc.yaml lists by name exists in params.yaml."""
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


def test_methods_drive_the_train_and_evaluate_stages():
    """train@<m> and evaluate@<m> exist for exactly params.yaml's methods (DVC's own
    resolution of dvc.yaml); train@<m> lists the knobs that m's settings make it read
    (knobs_read), which are those it trains with, so `-S k=...` reruns only the methods that
    read k; no evaluation lists a knob."""
    from dvc.repo import Repo

    from margrpo.config import KNOBS, KNOBS_OFF, knobs_read

    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    assert dvc["stages"]["evaluate"]["foreach"] == "${methods}"
    assert [e for e in _stage_params(dvc["stages"]["train"]["do"]) if "item" in e] == [
        f"${{item.{k}}}" for k in KNOBS]
    params = load_params(ROOT / "params.yaml")
    listed = {}
    with Repo(str(ROOT)) as repo:
        for stage in repo.index.stages:
            listed[stage.name] = {k for d in stage.deps if hasattr(d, "params") for k in d.params}
    methods = set(params.methods)
    assert {n.partition("@")[2] for n in listed if n.startswith("train@")} == methods
    assert {n.partition("@")[2] for n in listed if n.startswith("evaluate@")} == methods
    assert "evaluate_base" in listed
    for method in methods:
        reads = set(listed[f"train@{method}"]) & set(KNOBS)
        assert reads == set(knobs_read(params.methods[method])), method
        resolved = params.method(method)
        for knob in KNOBS:
            want = getattr(params if knob in reads else KNOBS_OFF, knob)
            assert getattr(resolved, knob) == want, (method, knob)
        assert not listed[f"evaluate@{method}"] & set(KNOBS), method
    assert sorted(m for m in methods if "k" in listed[f"train@{m}"]) == ["mar_grpo", "posterior"]
    assert sorted(m for m in methods if "tau" in listed[f"train@{m}"]) == ["grpo_frozen_spec"]
    assert listed["evaluate_base"] == listed["evaluate@grpo"]
    # the role map is read by the report alone: changing it reruns no training or evaluation
    assert "claims" in listed["report"] and not any("claims" in keys for n, keys in listed.items() if n != "report")


def test_dvc_yaml_is_what_the_generator_writes_for_params_yaml(tmp_path):
    """dvc.yaml's generated blocks (train stages, plots) match params.yaml; fails when a method
    is added or its settings change without `python -m pipeline.dvcyaml`."""
    from pipeline import dvcyaml

    params = load_params(ROOT / "params.yaml")
    text = (ROOT / "dvc.yaml").read_text()
    assert dvcyaml.render(params, text) == text, "dvc.yaml is stale: run python -m pipeline.dvcyaml"
    assert dvcyaml.problems(params, ROOT / "dvc.yaml") == []
    # a method that comes to read k, and a new method, make it stale; the generator mends it
    changed = load_params(ROOT / "params.yaml", {"methods.grpo.topk": True, "methods.extra": {"freeze_head": True}})
    (problem,) = dvcyaml.problems(changed, ROOT / "dvc.yaml")
    assert "train@grpo lists no knob but its settings read k, num_trajectories" in problem, problem
    assert "no stage train@extra" in problem and "fix: python -m pipeline.dvcyaml" in problem, problem
    (tmp_path / "dvc.yaml").write_text(text)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**shipped(), "methods": {
        **shipped()["methods"], "grpo": {"freeze_head": False, "topk": True}, "extra": {"freeze_head": True}}},
        sort_keys=False))
    args = ["--params", str(tmp_path / "params.yaml"), "--dvc-yaml", str(tmp_path / "dvc.yaml")]
    assert dvcyaml.main([*args, "--check"]) == 1 and dvcyaml.main(args) == 0 and dvcyaml.main([*args, "--check"]) == 0
    written = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    assert written["stages"]["train"]["foreach"]["grpo"] == {"k": "k", "tau": "train", "num_trajectories":
                                                               "num_trajectories"}
    assert "reports/eval/extra/grid.png" in written["plots"]
    assert dvcyaml.problems(changed, tmp_path / "dvc.yaml") == []


def test_validate_lets_an_experiment_change_the_knobs_a_method_reads(monkeypatch, capsys):
    """The ablation's tau arm sets +methods.<m>.consistency=true in a `dvc exp run`: the method
    comes to read tau, its train stage reruns anyway (its methods.<m> block changed), and the
    guard notes it instead of refusing. Outside an experiment, and for a new method, it refuses."""
    from pipeline.validate import check_dvc_yaml

    tau_arm = load_params(ROOT / "params.yaml", {"methods.mar_grpo.token_scope": "committed+speculative",
                                                 "methods.mar_grpo.consistency": True})
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    (problem,) = check_dvc_yaml(tau_arm, ROOT / "dvc.yaml")
    assert "train@mar_grpo lists k, num_trajectories but its settings read k, tau, num_trajectories" in problem
    monkeypatch.setenv("DVC_EXP_NAME", "abl-tau0")
    assert check_dvc_yaml(tau_arm, ROOT / "dvc.yaml") == []
    assert "experiment abl-tau0 changed those methods' settings" in capsys.readouterr().out
    extra = load_params(ROOT / "params.yaml", {"methods.extra": {"freeze_head": True}})
    (problem,) = check_dvc_yaml(extra, ROOT / "dvc.yaml")
    assert "no stage train@extra" in problem, problem


def test_top_level_plots_show_every_method():
    """dvc.yaml's top-level plots (no foreach there) hold a curve per method in each training
    plot and the sample grid of the base and of every method."""
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    methods = list(shipped()["methods"])
    curves = {name: props for entry in dvc["plots"] if isinstance(entry, dict) for name, props in entry.items()
              if any("reports/train/" in path for path in props.get("y", {}))}
    assert set(curves) == {"training reward", "training KL", "AR grad norm"}
    for name, props in curves.items():
        assert sorted(props["y"]) == sorted(f"reports/train/{m}/curves.csv" for m in methods), name
    grids = {entry for entry in dvc["plots"] if isinstance(entry, str) and entry.startswith("reports/eval/")}
    assert grids == {f"reports/eval/{t}/grid.png" for t in ["base", *methods]}


def test_validate_refuses_a_stage_list_of_methods(tmp_path):
    """The guard accepts the shipped dvc.yaml and refuses an evaluate stage that lists methods
    by hand instead of iterating over params.yaml's, and a train stage outside the generated
    block."""
    from pipeline.validate import check_dvc_yaml

    params = load_params(ROOT / "params.yaml")
    assert check_dvc_yaml(params, ROOT / "dvc.yaml") == []
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    dvc["stages"]["evaluate"]["foreach"] = {m: {} for m in params.methods}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dvc))
    (problem,) = check_dvc_yaml(params, tmp_path / "dvc.yaml")
    assert problem.startswith("dvc.yaml: stage evaluate iterates over {"), problem
    assert "fix: give it `foreach: ${methods}`" in problem, problem
    text = (ROOT / "dvc.yaml").read_text()
    (tmp_path / "dvc.yaml").write_text(text.replace("    # <<< generated (train)\n", ""))
    (problem,) = check_dvc_yaml(params, tmp_path / "dvc.yaml")
    assert "no generated block train" in problem and "python -m pipeline.dvcyaml" in problem, problem

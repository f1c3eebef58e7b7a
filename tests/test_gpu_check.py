"""The GPU check's machinery that runs without a GPU: its plan, the wheel folder's requirements
and dependency walk (scripts/build_wheels.py), the profile merge without DVC, and the messages
of a machine that lacks packages. The whole bare-machine path (a venv with torch alone, the
folder, every step at tiny sizes) is scripts/gpu_check_smoke.sh: minutes, so not in the suite."""
from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from margrpo.config import ParamsError, load_params
from pipeline import profile

REPO = Path(__file__).resolve().parents[1]
CHECK = REPO / "scripts" / "gpu_check.sh"
WHEELS = runpy.run_path(str(REPO / "scripts" / "build_wheels.py"))


def _check(*args: str, python: str = sys.executable, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHON": python, "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(CHECK), *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def _plan(*args: str) -> dict[str, tuple[int, str]]:
    out = _check("--dry", *args)
    assert out.returncode == 0, out.stderr
    steps = re.findall(r"^\[(.+?), <= (\d+) s\] (.*)$", out.stdout, re.M)
    return {name: (int(limit), cmd) for name, limit, cmd in steps}


def test_the_gpu_plan_installs_offline_merges_without_dvc_and_fits_eight_minutes():
    plan = _plan()
    assert list(plan) == ["install", "merge params_gpu.yaml", "cuda tests", "rollout float32", "rollout bfloat16",
                          "training step float32", "training step bfloat16", "probe mar_grpo"]
    assert sum(limit for limit, _ in plan.values()) <= 480
    assert "--no-index --find-links" in plan["install"][1]
    merge = plan["merge params_gpu.yaml"][1]
    assert "pipeline.profile params_gpu.yaml" in merge and "--out" in merge and "--apply" not in merge
    tests = plan["cuda tests"][1]
    assert "pytest -m cuda" in tests
    for name in ("test_trainer.py", "test_adapters.py", "test_device_paths.py"):
        assert f"tests/{name}" in tests
    for dtype in ("float32", "bfloat16"):
        assert f"--dtype {dtype} --images 512" in plan[f"rollout {dtype}"][1]
        assert f"--dtype {dtype} --params" in plan[f"training step {dtype}"][1]
    assert "--steps 50" in plan["probe mar_grpo"][1]
    files = [w for _, cmd in plan.values() for w in cmd.split() if w.endswith(".py")]
    assert {"benchmarks/sampling.py", "benchmarks/step_time.py", "probes/rl_probe.py"} <= set(files)
    assert all((REPO / f).is_file() for f in files), files


def test_the_smoke_plan_runs_the_same_steps_small_on_the_cpu():
    gpu, cpu = _plan(), _plan("--cpu-smoke")
    assert list(cpu) == [*list(gpu)[:2], "tiny base model", *list(gpu)[2:]]
    assert all(cpu[name][0] == 4 * gpu[name][0] for name in gpu)  # a busy 2-core machine
    for name in ("training step float32", "probe mar_grpo"):
        assert "-S runtime.device=cpu" in cpu[name][1] and "-S model.checkpoint=" in cpu[name][1]


def test_a_folder_without_requirements_is_refused(tmp_path):
    out = _check("--wheels", str(tmp_path), "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert f"{tmp_path}/requirements.txt missing: build the folder with scripts/build_wheels.py" in out.stdout + out.stderr


def test_missing_packages_are_named_with_the_pinned_install(tmp_path):
    """A Python without its site-packages stands for a machine that lacks them."""
    pytest.importorskip("tomllib")  # the pins come from pyproject.toml (Python 3.11+)
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    out = _check("--out", str(tmp_path / "out"), python=str(bare))
    assert out.returncode == 2
    err = out.stdout + out.stderr  # a step's output is teed to its log and stdout
    assert "missing Python packages (import names): torch diffusers transformers" in err
    version = "{}.{}".format(*sys.version_info[:2])
    assert f"scripts/build_wheels.py --python-version {version}" in err and "--wheels outputs/wheels" in err
    assert "'diffusers==0.42.1'" in err and "'transformers==5.24.0'" in err and "torch==" not in err


def test_requirements_are_pyprojects_less_torch_and_the_orchestration():
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = project["dependencies"] + project["optional-dependencies"]["dev"]
    reqs = WHEELS["requirements"]()
    left_out = {"torch", "dvc", "mlflow", "prefect", "matplotlib"}
    assert reqs == [line for line in lines if WHEELS["_name"](line) not in left_out]
    assert "diffusers==0.42.1" in reqs and not any(WHEELS["_name"](r) in left_out for r in reqs)


def test_the_wheel_walk_leaves_out_torch_and_what_only_torch_needs():
    closure = WHEELS["closure"]
    resolved = {
        "accelerate": {"version": "1.0", "requires_dist": ["torch>=2", "numpy", "pyyaml; extra == 'test'"]},
        "diffusers": {"version": "0.4", "requires_dist": ["filelock", "zipp; python_version < '3.8'", "hub[cli]"]},
        "hub": {"version": "1", "requires_dist": ["typer; extra == 'cli'", "tqdm; extra == 'other'"]},
        "numpy": {"version": "2"}, "typer": {"version": "0.1"}, "pyyaml": {"version": "6"}, "zipp": {"version": "3"},
    }
    have = {"torch": {"version": "2.13", "requires_dist": ["sympy", "filelock"]}, "sympy": {"version": "1"},
            "filelock": {"version": "3"}}
    env = {"python_version": "3.12", "sys_platform": "linux"}
    roots = ["accelerate==1.0", "diffusers==0.4"]
    assert closure(roots, resolved, have, env, skip={"torch"}) == {"accelerate", "numpy", "diffusers", "filelock",
                                                                   "hub", "typer"}
    assert "numpy" not in closure(roots, resolved, have, env, skip={"torch", "numpy"})
    with pytest.raises(SystemExit, match="tqdm .*neither resolved nor installed"):
        closure(["hub[other]"], resolved, have, env, skip={"torch"})


def test_platform_tags_reach_the_targets_glibc():
    flags = WHEELS["platforms"]("2.28")
    tags = flags[1::2]
    assert set(flags[::2]) == {"--platform"}
    assert {"manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags


def test_a_profile_merges_into_a_new_file_without_dvc(tmp_path, monkeypatch):
    # `import dvc...` now fails, as on a bare machine, even where an earlier test imported DVC
    # (a cached submodule such as dvc.utils.serialize would otherwise import without its parent)
    for name in [m for m in sys.modules if m == "dvc" or m.startswith("dvc.")] + ["dvc", "dvc.utils.serialize"]:
        monkeypatch.setitem(sys.modules, name, None)
    base = tmp_path / "params.yaml"
    base.write_text((REPO / "params.yaml").read_text())
    out = tmp_path / "merged" / "gpu.yaml"
    profile.main([str(REPO / "params_gpu.yaml"), "--params", str(base), "--out", str(out)])
    expect = profile.merge(yaml.safe_load(base.read_text()), yaml.safe_load((REPO / "params_gpu.yaml").read_text()))
    assert yaml.safe_load(out.read_text()) == expect
    assert load_params(out).runtime.device == "cuda"
    assert base.read_text() == (REPO / "params.yaml").read_text()
    with pytest.raises(SystemExit, match="DVC is not installed.*--out FILE"):
        profile.main([str(REPO / "params_gpu.yaml"), "--params", str(base), "--apply"])


def test_a_profile_key_that_runs_into_a_value_is_named():
    with pytest.raises(ParamsError, match=r"train\.lr\.x: train\.lr in params\.yaml is the value 0\.1, not a section"):
        profile.merge({"train": {"lr": 0.1}}, {"train": {"lr": {"x": 1}}})

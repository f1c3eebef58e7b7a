"""The study pipeline end to end on tiny params: real DVC, Prefect and MLflow in a scratch
repo (one `dvc repro`, committed, shared by every test of this module).

- the study: every stage runs once, the guard first; report, metrics, plots, MLflow runs;
- bad input: a rejected `dvc exp run -S` costs nothing (outputs, runs, checkpoints and
  params.yaml survive) and says what is wrong in a few lines, quickly;
- ablations: each top-level knob reruns only the training and evaluation of the methods
  that read it, and the report;
- the README's commands, as typed, on a fresh clone (no DVC cache, no mlflow.db);
- faults: a stage killed with SIGTERM or SIGKILL, or its `dvc` killed alone, leaves no
  process behind, marks its MLflow runs KILLED, changes no committed file, and the rerun
  resumes; a second `dvc exp run` is refused while a stage runs.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import yaml

from pipeline.proc import SHELLS
from pipeline_tiny import (REPO, TINY, clone, commit, dvc, git_changes, merge, pipeline_env, ran_stages,
                           read_json, run, run_ids, runs, user_edit, wait_for)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

METHODS = tuple(yaml.safe_load((REPO / "params.yaml").read_text())["methods"])
STAGES = {"validate", "prepare_prompts", "pretrain_base", "sample_baseline", *(f"train@{m}" for m in METHODS),
          "evaluate_base", *(f"evaluate@{m}" for m in METHODS), "report"}
ABLATION = {"validate", "train@mar_grpo", "evaluate@mar_grpo", "train@posterior", "evaluate@posterior", "report"}
# One long-running seed with frequent checkpoints, so a kill lands mid-training, as two
# torchrun ranks (the default runtime.nproc): the stage process launches torchrun, rank 0
# holds the MLflow runs. 200 steps of ~0.03 s: three resumed runs must not finish before
# their kill.
LONG = {"train": {"seeds": [0], "steps": 200, "checkpoint_every": 5, "grad_probe_every": 0},
        "runtime": {"nproc": 2}}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from pipeline_tiny import prefect_server, scratch_repo

    tmp = tmp_path_factory.mktemp("study")
    root = scratch_repo(tmp / "repo", TINY)
    # The quick profile of this scratch repo changes nothing: `python -m pipeline.quick` then
    # exercises its own plumbing (a --temp experiment, the report copied out) in seconds;
    # the ablation test runs a --temp experiment that retrains.
    (root / "params_quick.yaml").write_text("{}\n")
    commit(root, "tiny quick profile")
    with prefect_server(tmp / "prefect-home"):
        t0 = time.time()
        out = dvc(root, "repro")
        seconds = time.time() - t0
        commit(root, "tiny study")
        yield SimpleNamespace(root=root, out=out, seconds=seconds)


def test_repro_runs_every_stage_once_and_records_the_study(study):
    root, out = study.root, study.out
    assert ran_stages(out) == STAGES, out[-3000:]
    assert out.index("Running stage 'validate'") < min(out.index(f"Running stage '{s}'") for s in STAGES - {"validate"})
    plan = next(line for line in out.splitlines() if line.startswith("validate: "))
    assert "retrains grpo, grpo_frozen, mar_grpo" in plan and " min " in plan, plan

    md = (root / "reports/report.md").read_text()
    headings = re.findall(r"^## (.+)$", md, re.M)
    assert headings[:3] == ["At a glance", "Claims", "Summary"] and {"Test scores: base vs trained methods", "Training curves",
                                         "Final and best checkpoints (test split)", "Learning checks"} <= set(headings)
    assert "| 6 | Scoring only committed tokens" in md  # grpo_frozen vs grpo_frozen_spec
    assert re.search(r"^\*git [0-9a-f]{10} · .+ · experiment workspace · params [0-9a-f]{8}", md, re.M)
    assert "Claim 4 (" in md and "| 4 |" not in md  # not judged: the reason is printed instead
    html = (root / "reports/report.html").read_text()
    assert "data:image/png;base64," in html and not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    assert html.index("<figcaption>") < html.index("<img")  # captions above the images
    summary = read_json(root / "reports/summary.json")
    assert set(summary["overall"]) == {"base", *METHODS} and set(summary["gain"]) == set(METHODS)
    assert set(summary["claims"]) == {"claim1", "claim2", "claim3", "claim5", "claim6"}
    for target in ("base", *METHODS):
        metrics = read_json(root / f"reports/eval/{target}/metrics.json")
        assert metrics["replicates"] == len(TINY["train"]["seeds"])
        assert (root / f"reports/eval/{target}/scores.csv").read_text().startswith("metric,score\n")
        if target == "base":
            continue
        # A best/ that holds the final weights (always so when selected at the last step) is
        # not resampled: its scores are the final's.
        per_seed, per_seed_best = (read_json(root / f"reports/eval/{target}/{f}.json") for f in ("per_seed", "per_seed_best"))
        steps = TINY["train"]["steps"] * yaml.safe_load((root / "params.yaml").read_text())["methods"][target].get(
            "steps_factor", 1)
        same = []
        for s in TINY["train"]["seeds"]:
            final, best = (root / f"models/rl/{target}/seed{s}/{w}" for w in ("final", "best"))
            weights = [p.name for p in final.glob("*.safetensors")]
            if weights and all((final / w).read_bytes() == (best / w).read_bytes() for w in weights):
                same.append(s)
                assert per_seed_best[str(s)] == per_seed[str(s)], target
            else:
                assert read_json(best / "best.json")["step"] != steps, target
        base = read_json(root / "reports/eval/base/metrics.json")
        replicates = len(TINY["train"]["seeds"])
        assert metrics["images"] * replicates == base["images"] * (2 * replicates - len(same)), (target, same)
    # A method's steps_factor, paired_base and probe interval reach its training run through the pipeline.
    for m, cfg in yaml.safe_load((root / "params.yaml").read_text())["methods"].items():
        rows = [json.loads(line) for line in (root / f"reports/train/{m}/seeds/seed0/history.jsonl").read_text().splitlines()]
        assert len(rows) == TINY["train"]["steps"] * cfg.get("steps_factor", 1), m
        assert all(("reward/vs_base" in r) == cfg.get("paired_base", False) for r in rows), m
        probe_every = cfg.get("grad_probe_every", TINY["train"]["grad_probe_every"])
        assert [i for i, r in enumerate(rows) if "probe/snr" in r] == (
            [i for i in range(len(rows)) if i % probe_every == 0] if probe_every else []), m
    plots = json.loads(dvc(root, "plots", "show", "--json"))
    assert not plots.get("errors"), plots.get("errors")
    assert {"training reward", "reports/eval/mar_grpo/scores.csv"} <= set(plots["data"])

    # MLflow: flat runs (no nesting), every one FINISHED, named and tagged for the runs table.
    all_runs = runs(root)
    assert {status for _, status, _ in all_runs} == {"FINISHED"}
    parents = [(name, tags) for name, _, tags in all_runs if tags.get("margrpo.role") == "parent"]
    assert len(parents) == 1 and parents[0][0].startswith("workspace @ ")
    names = {name for name, _, _ in all_runs}
    assert {"prepare_prompts", "train grpo seed0", "train mar_grpo seed1", "evaluate base", "report"} <= names
    assert not any("mlflow.parentRunId" in tags for _, _, tags in all_runs)

    # The guard reruns on every repro and rewrites the same stamp: nothing downstream reruns.
    assert ran_stages(dvc(root, "repro")) == {"validate"}
    assert git_changes(root) == []


def _snapshot(root: Path) -> dict:
    files = [p for pattern in ("models/**/*", "reports/**/*", "outputs/**/*", "prompts/*")
             for p in map(Path, glob.glob(str(root / pattern), recursive=True)) if p.is_file()]
    return {"files": {str(p.relative_to(root)): p.stat().st_mtime_ns for p in files},
            "runs": sorted((n, s) for n, s, _ in runs(root)), "params": (root / "params.yaml").read_text()}


def _checkpoint(root: Path, method: str, overrides: dict) -> Path:
    """Where train@<method> seed 0 would resume from with these params overrides."""
    code = ("import json, sys; from margrpo.config import load_params; from pipeline.train import checkpoint_dir; "
            "p = load_params('params.yaml', json.loads(sys.argv[1])); print(checkpoint_dir(p, sys.argv[2], 0))")
    return root / run(root, "python", "-c", code, json.dumps(overrides), method).stdout.strip()


def _rejected(root: Path, *args: str, expect: str) -> float:
    t0 = time.time()
    proc = run(root, "dvc", *args, check=False)
    seconds = time.time() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert expect in out, out
    assert "Traceback" not in out and len(out.strip().splitlines()) <= 12, out
    assert ran_stages(out) == {"validate"}, out
    return seconds


def test_bad_input_is_refused_before_any_work_and_costs_nothing(study):
    """Through the real `dvc exp run` (tests/test_rejected_set_param.py has many more values,
    replaying DVC's rewrite): params.yaml comes back byte for byte, the user's uncommitted
    edits included, and no output, run or checkpoint changes."""
    root = study.root
    params = root / "params.yaml"
    before = _snapshot(root)
    timings = {
        # a list entry by index: DVC's rewrite also turns every flow list into a block list
        # and drops the comment below the rewards list; the byte comparison below sees that
        "rewards.0.weight=0": _rejected(root, "exp", "run", "-S", "rewards.0.weight=0",
                                        expect="rewards.0.weight: weight 0 turns this reward off"),
        # a rule of the trainer's (whole groups per rank), refused before any stage starts
        "runtime.nproc=3": _rejected(root, "exp", "run", "-S", "runtime.nproc=3",
                                     expect="runtime.nproc: 3 ranks cannot split the prompts of a training step"),
    }
    assert params.read_bytes() == before["params"].encode() and git_changes(root) == []
    # With the user's own uncommitted edits, the -S one overriding: all of them come back.
    edited = user_edit(before["params"])
    params.write_text(edited)
    timings["train.adam_betas.1=2, edited file"] = _rejected(root, "exp", "run", "-S", "train.adam_betas.1=2",
                                                             expect="train.adam_betas.1: Input should be less than 1")
    assert params.read_bytes() == edited.encode(), "the user's uncommitted edits of params.yaml were lost"
    params.write_text(before["params"])

    # A damaged checkpoint that the next training would resume from.
    ckpt = _checkpoint(root, "grpo", {"train.steps": 4}) / "ckpt.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"PK\x03\x04 cut short")
    timings["damaged ckpt.pt"] = _rejected(root, "exp", "run", "-S", "train.steps=4",
                                           expect=f"{ckpt.relative_to(root)}: not a complete torch checkpoint")
    ckpt.unlink()
    ckpt.parent.rmdir()
    # A truncated base model: refused (not silently re-pretrained), left as it is.
    weights = root / "models/base/diffusion_pytorch_model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    timings["truncated base"] = _rejected(root, "repro", expect="the file is truncated")
    assert weights.read_bytes() == good[: len(good) // 2]
    weights.write_bytes(good)
    os.utime(weights, ns=(before["files"]["models/base/diffusion_pytorch_model.safetensors"],) * 2)

    after = _snapshot(root)
    assert after["params"] == before["params"] and after["runs"] == before["runs"]
    assert after["files"] == before["files"], set(after["files"].items()) ^ set(before["files"].items())
    assert git_changes(root) == []
    print("seconds per rejected command (dvc startup included):", {k: round(v, 1) for k, v in timings.items()})


def test_each_ablation_knob_reruns_only_the_methods_that_read_it(study):
    root = study.root
    text = (root / "params.yaml").read_text()
    # k and M are the multi-trajectory methods' (both estimators, topk); tau filters
    # grpo_frozen_spec's speculative tokens (consistency), the one method that reads it
    mte = {"mar_grpo", "posterior"}
    for knob, value, readers in (("k", 0.5, mte), ("tau", 0.5, {"grpo_frozen_spec"}),
                                 ("num_trajectories", 3, mte)):
        params = yaml.safe_load(text)
        params[knob] = value
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        stale = set(json.loads(dvc(root, "status", "--json"))) - {"validate"}
        assert stale == {f"train@{m}" for m in readers}, (knob, stale)
    (root / "params.yaml").write_text(text)

    # As the README types it: a --temp experiment; evaluate and report follow the training.
    before = run_ids(root)
    out = dvc(root, "exp", "run", "--temp", "-S", "num_trajectories=3")
    assert ran_stages(out) == ABLATION, out[-3000:]
    assert git_changes(root) == []
    new = [(n, tags) for n, _, tags in runs(root, exclude=before)]
    exp = {tags.get("dvc.exp_name") for _, tags in new}
    assert len(exp) == 1 and exp != {"workspace"}, "the --temp experiment's runs are not in the main store"
    assert {"train mar_grpo seed0", "evaluate mar_grpo", "report"} <= {n for n, _ in new}
    assert not list((root / ".dvc" / "tmp").rglob("mlflow.db"))
    name = exp.pop()
    table = run(root, "python", "scripts/exp_table.py").stdout
    row = next(line for line in table.splitlines() if name in line)
    assert "| 3 |" in row, table


# The README's commands that run here as typed (each must appear verbatim in README.md).
README_COMMANDS = [
    "python -m pipeline.quick",
    "dvc exp run --dry -S k=0.5",
    "python scripts/mlflow_ui.py --no-serve",
    "python scripts/exp_table.py",
    "dvc exp show --drop '.*' --keep '^(Experiment|k|tau|num_trajectories|train\\.steps|overall\\..*|gain\\..*)$'",
]


def test_readme_commands_as_typed(study, tmp_path):
    readme = (REPO / "README.md").read_text()
    for cmd in README_COMMANDS:
        assert cmd in readme, f"README.md no longer has: {cmd}"
    # A fresh clone (no DVC cache, no mlflow.db) for --dry and the MLflow rebuild; the study
    # repo (trained models in its cache) for the quick profile and the comparison.
    fresh = clone(study.root, tmp_path / "clone")
    outputs = {}
    for cmd in README_COMMANDS:
        root = fresh if cmd.startswith(("dvc exp run --dry", "python scripts/mlflow_ui.py")) else study.root
        proc = subprocess.run(cmd, shell=True, cwd=root, env=pipeline_env(root), capture_output=True, text=True,
                              timeout=600)
        outputs[cmd] = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{cmd}:\n{outputs[cmd][-3000:]}"
        assert git_changes(root) == [], f"{cmd} changed committed files"
    quick = outputs["python -m pipeline.quick"]
    assert quick.startswith("quick: ") and " min " in quick.splitlines()[0], quick[:500]
    assert list(study.root.glob("outputs/quick/quick-*/reports/report.html"))
    assert "Running stage 'train@mar_grpo'" in outputs["dvc exp run --dry -S k=0.5"]
    rebuilt = runs(fresh)
    assert {n for n, _, tags in rebuilt if tags.get("margrpo.role") == "parent"} == {f"committed @ {_head(fresh)[:7]}"}
    assert {"train grpo seed1", "evaluate mar_grpo"} <= {n for n, _, _ in rebuilt}
    assert "overall.mar_grpo" in outputs[README_COMMANDS[-1]]
    assert "quick-" in outputs["python scripts/exp_table.py"]


def _head(root: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout


def _start(root: Path) -> subprocess.Popen:
    # A new session, so the test can tell the pipeline's processes from its own.
    return subprocess.Popen(["dvc", "repro", "train@grpo"], cwd=root, env=pipeline_env(root, ephemeral=True),
                            start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _training(root: Path, proc: subprocess.Popen) -> tuple[psutil.Process, list[psutil.Process]]:
    """The stage process (the Python process DVC's command started, which holds the repo
    lock) once it has written a checkpoint in this run, and every process of the session
    (dvc, stage, torchrun and its ranks, Prefect's server, the reapers)."""
    t0 = time.time()
    dvc_proc = psutil.Process(proc.pid)

    def ready():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        fresh = [p for p in glob.glob(str(root / "outputs/ckpt/grpo/*/seed0/ckpt.pt")) if os.path.getmtime(p) > t0]
        # Not the `sh -c` wrapper: without $SHELL DVC runs the command through /bin/sh, and
        # dash (Debian's sh) does not exec it, so `sh -c "python -m pipeline.train ..."` stays
        # as the stage's parent. The first Python process is the stage; torchrun and its
        # ranks are below it.
        stage = [p for p in dvc_proc.children(recursive=True)
                 if "pipeline.train" in _cmdline(p) and _name(p) not in SHELLS]
        return stage[0] if fresh and stage else None

    stage = wait_for(ready, 300, "a checkpoint of train@grpo")
    procs = [dvc_proc, *dvc_proc.children(recursive=True)]
    procs += [p for p in psutil.process_iter() if f"pipeline.reaper {stage.pid}" in _cmdline(p)]
    return stage, procs


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return ""


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # exited meanwhile (the validate stage, a finished child)
        return ""


def _all_gone(procs: list[psutil.Process]) -> bool:
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _status(root: Path, name: str | None) -> str | None:
    """Status of the newest run named `name` (None: of the newest study run)."""
    matches = [s for n, s, tags in runs(root) if n == name or (name is None and tags.get("margrpo.role") == "parent")]
    return matches[-1] if matches else None


def _parent_status(root: Path) -> str | None:
    """Status of the newest study run."""
    return _status(root, None)


def test_faults_kill_clean_up_and_resume(study, tmp_path):
    root = clone(study.root, tmp_path / "clone")
    # A stage that fails (a fresh clone has no trained models to evaluate): one traceback
    # (Prefect's), one summary line, its runs FAILED.
    failed = run(root, "python", "-m", "pipeline.evaluate", "--target", "grpo", check=False)
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1 and out.count("Traceback") == 1, out[-3000:]
    assert re.search(r"^evaluate@grpo: failed: FileNotFoundError: models/rl/grpo", out, re.M), out[-3000:]
    assert _status(root, "evaluate grpo") == "FAILED" and _parent_status(root) == "FAILED"
    params = yaml.safe_load((root / "params.yaml").read_text())
    (root / "params.yaml").write_text(yaml.safe_dump(merge(params, LONG), sort_keys=False))
    commit(root, "long training")
    for victim, sig in (("stage", signal.SIGTERM), ("stage", signal.SIGKILL), ("dvc", signal.SIGTERM)):
        proc = _start(root)
        stage, procs = _training(root, proc)
        if victim == "dvc":
            # While a stage runs, a second workspace experiment is refused before it touches
            # params.yaml. The stage and its ranks are paused meanwhile: a tiny step takes
            # ~0.03 s, and on a fast machine the training would otherwise end (FINISHED, the
            # lock released) before the second command or the kill. The running stage
            # rewrites its own outputs as it goes (restored on the kill below), so the
            # refusal is checked as "no change beyond the paused stage's".
            paused = [stage, *stage.children(recursive=True)]
            for p in paused:
                p.suspend()
            before = git_changes(root)
            second = run(root, "dvc", "exp", "run", "-S", "k=0.9", check=False, ephemeral=True)
            after = git_changes(root)
            for p in paused:
                p.resume()
            assert second.returncode != 0 and "Unable to acquire lock" in second.stdout + second.stderr
            assert after == before, f"the refused experiment changed the workspace: {before} -> {after}"
            assert not [line for line in after if not line[3:].startswith("reports/train/grpo/")], after
        (stage if victim == "stage" else psutil.Process(proc.pid)).send_signal(sig)
        out = proc.communicate(timeout=120)[0]
        wait_for(lambda: _all_gone(procs), 60, f"every process to end after {sig.name} to the {victim}")
        killed = lambda: _status(root, "train grpo seed0") == "KILLED" and _parent_status(root) == "KILLED"  # noqa: E731
        try:
            wait_for(killed, 30, "the training run and the study run marked KILLED")
        except AssertionError as err:
            statuses = [(name, status) for name, status, _ in runs(root)]
            raise AssertionError(f"{err} after {sig.name} to the {victim}; runs {statuses}; output:\n{out[-4000:]}")
        assert git_changes(root) == [], f"{sig.name} to the {victim} changed committed files"

    out = run(root, "dvc", "repro", "train@grpo", check=False, ephemeral=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "resuming from the checkpoint" in out.stdout + out.stderr
    history = root / "reports/train/grpo/seeds/seed0/history.jsonl"
    steps = [json.loads(line)["step"] for line in history.read_text().splitlines()]
    assert steps == list(range(1, LONG["train"]["steps"] + 1)), "history must cover every step exactly once"
    assert _status(root, "train grpo seed0") == "FINISHED"
    assert "up to date" in dvc(root, "status", "train@grpo") or not dvc(root, "status", "train@grpo").strip()

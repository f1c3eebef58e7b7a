"""The real pipeline end to end on tiny params: `dvc repro` in a scratch copy of the repo
(real Prefect flows, a real MLflow sqlite store in the copy), then `dvc exp run -S k=...`
must rerun only train@mar_grpo, report and (when the weights changed) evaluate@mar_grpo."""
from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time

import pytest

from pipeline_tiny import TINY, VENV_BIN, pipeline_env, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STAGES = {"prepare_prompts", "pretrain_base", "sample_baseline", "train@grpo", "train@grpo_frozen",
          "train@mar_grpo", "evaluate@base", "evaluate@grpo", "evaluate@grpo_frozen", "evaluate@mar_grpo", "report"}


def dvc(root, *args, check=True):
    proc = subprocess.run([str(VENV_BIN / "dvc"), *args], cwd=root, env=pipeline_env(root),
                          capture_output=True, text=True)
    if check and proc.returncode:
        raise AssertionError(f"dvc {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


def locked_out_md5(root, stage: str, path: str) -> str:
    """md5 that dvc.lock records for one output of one stage."""
    import yaml

    outs = yaml.safe_load((root / "dvc.lock").read_text())["stages"][stage]["outs"]
    return next(o["md5"] for o in outs if o["path"] == path)


ABLATION_STAGES = {"train@mar_grpo", "evaluate@mar_grpo", "report"}


def test_pipeline_smoke(tmp_path):
    root = scratch_repo(tmp_path / "repo", TINY)
    t0 = time.time()
    out = dvc(root, "repro")
    repro_s = time.time() - t0
    assert ran_stages(out) == STAGES, out[-3000:]

    # Report: Markdown + one self-contained HTML file (images inline, nothing fetched).
    md = (root / "reports/report.md").read_text()
    for heading in ("Held-out scores", "Training curves", "Samples", "Uncertainty", "Gradient-variance",
                    "Claims", "Params used"):
        assert heading in md
    html = (root / "reports/report.html").read_text()
    assert "data:image/png;base64," in html
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    assert "claim" in md.lower() and re.search(r"\| (holds|does not hold|inconclusive) \|", md)

    # Metrics: well-formed JSON that DVC reads; every eval target scored on every seed.
    for target in ("base", "grpo", "grpo_frozen", "mar_grpo"):
        m = json.loads((root / f"reports/eval/{target}/metrics.json").read_text())
        assert m["replicates"] == len(TINY["train"]["seeds"])
        assert 0.0 <= m["mean"]["eval/geneval/overall"] <= 1.0
        assert {"eval/t2i/mean", "eval/partial"} <= set(m["mean"])
    summary = json.loads((root / "reports/summary.json").read_text())
    assert set(summary["claims"]) == {f"claim{i}" for i in range(1, 6)}
    assert "reports/summary.json" in dvc(root, "metrics", "show", "--json")
    assert (root / "reports/train/mar_grpo/curves.csv").read_text().startswith("step,")
    # The report's inputs are in git-tracked outputs: it rebuilds without the trained weights.
    for seed in TINY["train"]["seeds"]:
        assert (root / f"reports/train/mar_grpo/seeds/seed{seed}/history.jsonl").stat().st_size > 0
    assert "dvc.lock" in {p.name for p in root.iterdir()}
    plots = json.loads(subprocess.run([str(VENV_BIN / "dvc"), "plots", "show", "--json"], cwd=root,
                                      env=pipeline_env(root), capture_output=True, text=True).stdout)
    assert not plots.get("errors"), plots.get("errors")
    assert {"training reward", "training KL", "reports/eval/mar_grpo/grid.png"} <= set(plots["data"])

    # MLflow: one parent run for the study, child runs tagged with stage / method / seed.
    db = sqlite3.connect(root / "mlflow.db")
    tags = db.execute("select run_uuid, key, value from tags").fetchall()
    roles = {}
    for run, key, value in tags:
        roles.setdefault(run, {})[key] = value
    parents = [r for r, t in roles.items() if t.get("margrpo.role") == "parent"]
    children = [t for t in roles.values() if t.get("margrpo.role") == "child"]
    assert len(parents) == 1
    assert all(t["mlflow.parentRunId"] == parents[0] for t in children)
    assert {(t["stage"], t.get("method"), t.get("seed")) for t in children} >= {
        ("train", "grpo", "0"), ("train", "mar_grpo", "1"), ("evaluate", "base", None), ("report", None, None)}
    steps = db.execute("select count(*) from metrics where key = 'reward/mean'").fetchone()[0]
    assert steps >= len(TINY["train"]["seeds"]) * 2 * TINY["train"]["steps"]

    # The ablation knob reruns only what reads it.
    # evaluate@mar_grpo reruns exactly when the retrained weights differ (DVC skips it otherwise).
    before = locked_out_md5(root, "train@mar_grpo", "models/rl/mar_grpo")
    ran = ran_stages(dvc(root, "exp", "run", "-S", "k=0.5"))
    weights_changed = locked_out_md5(root, "train@mar_grpo", "models/rl/mar_grpo") != before
    assert ran == ABLATION_STAGES - (set() if weights_changed else {"evaluate@mar_grpo"})

    # A --temp experiment runs in .dvc/tmp/exps/... yet logs to this repo's store. Commit the
    # study's cache: false outputs first, as a researcher would, so the scratch workspace has them.
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-q", "-m", "study outputs"], cwd=root, check=True)
    ran = ran_stages(dvc(root, "exp", "run", "--temp", "-S", "tau=0.5"))
    assert {"train@mar_grpo", "report"} <= ran <= ABLATION_STAGES
    parents = db.execute("select count(*) from tags where key = 'margrpo.role' and value = 'parent'").fetchone()[0]
    assert parents == 3, "the --temp experiment's runs did not reach the main repo's mlflow.db"
    assert not list((root / ".dvc" / "tmp").rglob("mlflow.db"))
    print(f"dvc repro: {repro_s:.0f} s; total with the k experiment: {time.time() - t0:.0f} s")

"""Rebuild the committed study's MLflow runs from the files in reports/ (a fresh clone has
no mlflow.db: it is not committed).

Everything a stage logs to MLflow is also written to a git-tracked report file, so the runs
can be recreated without rerunning anything: per-step training metrics from
reports/train/<method>/seeds/seed<s>/history.jsonl, final-window means from
reports/train/<method>/metrics.json, test-split scores from reports/eval/<target>/,
the baseline and pretraining numbers, and the headline numbers from reports/summary.json.
The study gets the experiment name "committed" and the tag margrpo.rebuilt = true; its id
is derived from the git revision and params.yaml like a `dvc repro` study's, so a second
rebuild of the same commit finds it and adds nothing.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from margrpo.tracking.runs import (Study, find_parent, git_revision, headline_metrics, open_experiment, params_hash,
                                   study_name)

EXP_NAME = "committed"


def _history(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _log_history(study: Study, run_id: str, rows: list[dict]) -> None:
    for row in rows:
        study.log_metrics(run_id, {k: v for k, v in row.items() if k != "step"}, int(row["step"]))


def rebuild(root: Path, uri: str, params: dict, artifact_root: Path | None = None) -> tuple[str, bool]:
    """(study id, created) for the study described by root/reports and root/params.yaml."""
    reports = Path(root) / "reports"
    text = (Path(root) / "params.yaml").read_text()
    rev = git_revision(root)
    sid = f"{rev[:10]}-{EXP_NAME}-{params_hash(text)}"
    tags = {"git.revision": rev, "mlflow.source.git.commit": rev, "dvc.exp_name": EXP_NAME,
            "params.hash": params_hash(text), "margrpo.rebuilt": "true"}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if find_parent(client, open_experiment(client, artifact_root), sid) is not None:
        return sid, False
    study = Study(uri, sid, params, tags, artifact_root, name=study_name(EXP_NAME, rev))

    pretrain = reports / "pretrain"
    if (pretrain / "metrics.json").exists():
        run = study.child("pretrain_base")
        if (pretrain / "curve.csv").exists():
            with open(pretrain / "curve.csv") as f:
                _log_history(study, run, [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)])
        study.log_metrics(run, json.loads((pretrain / "metrics.json").read_text()))
        study.finish(run)
    if (reports / "baseline" / "metrics.json").exists():
        run = study.child("sample_baseline", "base")
        study.log_metrics(run, json.loads((reports / "baseline" / "metrics.json").read_text()))
        study.finish(run)
    for method_dir in sorted(p for p in (reports / "train").glob("*") if p.is_dir()):
        method = method_dir.name
        for seed_dir in sorted((method_dir / "seeds").glob("seed*")):
            if (seed_dir / "history.jsonl").exists():
                run = study.child("train", method, int(seed_dir.name.removeprefix("seed")))
                _log_history(study, run, _history(seed_dir / "history.jsonl"))
                study.finish(run)
        if (method_dir / "metrics.json").exists():
            run = study.child("train", method)
            final = json.loads((method_dir / "metrics.json").read_text())["final_window"]["mean"]
            study.log_metrics(run, {f"final/{k}": v for k, v in final.items()})
            study.finish(run)
    for target_dir in sorted(p for p in (reports / "eval").glob("*") if p.is_dir()):
        metrics = json.loads((target_dir / "metrics.json").read_text())
        run = study.child("evaluate", target_dir.name)
        study.log_metrics(run, metrics["mean"], digits=4)
        study.log_metrics(run, {f"{k}_std": v for k, v in metrics["std"].items()}, digits=4)
        if (target_dir / "per_seed.json").exists():
            for seed, scores in json.loads((target_dir / "per_seed.json").read_text()).items():
                study.log_metrics(run, {f"seed{seed}/{k}": v for k, v in scores.items()})
        study.finish(run)
    if (reports / "summary.json").exists():
        summary = json.loads((reports / "summary.json").read_text())
        run = study.child("report")
        study.log_metrics(run, headline_metrics(summary), digits=4)
        study.log_metrics(study.parent_id, headline_metrics(summary), digits=4)
        for name in ("report.html", "report.md", "summary.json"):
            study.log_artifact(study.parent_id, reports / name, "report")
        study.finish(run)
    study.close()
    return sid, True


def prepare_store(root: Path) -> tuple[str, str]:
    """What the UI and the screenshots need: the committed study in root/mlflow.db (rebuilt
    if missing), artifact paths pointing into root, the saved views refreshed. Returns
    (tracking uri, experiment id)."""
    from mlflow.tracking import MlflowClient

    from margrpo.config import load_params
    from margrpo.tracking.runs import artifact_root, tracking_uri

    uri = tracking_uri(root)
    params = load_params(Path(root) / "params.yaml").model_dump(mode="json")
    sid, created = rebuild(root, uri, params, artifact_root(root))
    exp_id = open_experiment(MlflowClient(tracking_uri=uri), artifact_root(root), ["base", *params["methods"]])
    print(f"mlflow: committed study {sid} {'added to' if created else 'already in'} {uri}")
    return uri, exp_id


def ablation_rows(records: list[dict], root: Path) -> int:
    """Give every ablation record (scripts/ablation.py) a parent run in the MLflow study view
    of the repository at `root`, tagged margrpo.ablation = <arm>; returns how many were
    created (an experiment's own stages made the others; a fresh clone has none)."""
    from mlflow.tracking import MlflowClient

    from margrpo.tracking.runs import artifact_root, tracking_uri

    uri, location = tracking_uri(root), artifact_root(root)
    client = MlflowClient(tracking_uri=uri)
    exp_id = open_experiment(client, location)
    made = 0
    for rec in records:
        if rec["arm"] == "centre":
            continue
        parent = find_parent(client, exp_id, rec["study"])
        if parent is None:
            tags = {"git.revision": rec["baseline"], "mlflow.source.git.commit": rec["baseline"],
                    "dvc.exp_name": rec["name"], "margrpo.rebuilt": "true"}
            study = Study(uri, rec["study"], rec["params"], tags, location,
                          name=study_name(rec["name"], rec["baseline"]))
            study.log_metrics(study.parent_id, headline_metrics(rec["summary"]), digits=4)
            study.close()
            run_id, made = study.parent_id, made + 1
        else:
            run_id = parent.info.run_id
        client.set_tag(run_id, "margrpo.ablation", rec["arm"])
    return made

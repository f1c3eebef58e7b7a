"""MLflow runs of one study: a parent run per `dvc repro` / `dvc exp run`, a child per stage.

Everything goes through MlflowClient with explicit run ids, never the fluent "active run":
Prefect runs `.submit()`-ed tasks in worker threads, where the active run is not visible.

A study is identified by `study_id` (git revision + DVC experiment name + params hash):
every stage process of one `dvc exp run` computes the same id, so they find the same parent
run by its tag. A child run is found again by its tags (stage, method, seed) only while it
is unfinished, so a stage killed and rerun keeps logging into the same run, while a
finished stage that reruns (code changed) gets a fresh child.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from margrpo.tracking.flatten import flatten

EXPERIMENT = "margrpo-study"
TAG_STUDY = "margrpo.study"
TAG_ROLE = "margrpo.role"


def tracking_uri(root: Path) -> str:
    """MLFLOW_TRACKING_URI if set, else an absolute sqlite file in the repo root (absolute
    so that `dvc exp run --temp/--queue`, which run in .dvc/tmp/exps/..., share it)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(root).resolve()}/mlflow.db"


def main_repo_root(root: Path) -> Path:
    """The repository whose mlflow.db a run logs to.

    `dvc exp run --temp` and queued experiments run in a scratch workspace under
    <repo>/.dvc/tmp/exps/ and DVC_ROOT points there; their runs belong in <repo>'s store,
    next to the workspace runs, or they would vanish with the scratch folder.
    """
    parts = Path(root).resolve().parts
    for i in range(len(parts) - 2):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return Path(root).resolve()


def git_revision(root: Path) -> str:
    # Queued/temp experiments run in a scratch clone; DVC passes the baseline commit.
    rev = os.environ.get("DVC_EXP_BASELINE_REV")
    if rev:
        return rev
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "no-git"


def artifact_root(root: Path) -> Path | None:
    """Where artifacts go with the default sqlite store; None defers to a user's server."""
    return None if os.environ.get("MLFLOW_TRACKING_URI") else Path(root).resolve() / "mlartifacts"


def study_id(root: Path, params_text: str) -> str:
    exp = os.environ.get("DVC_EXP_NAME") or "workspace"
    digest = hashlib.sha256(params_text.encode()).hexdigest()[:8]
    return f"{git_revision(root)[:10]}-{exp}-{digest}"


class Study:
    """The parent run of one study and helpers to find or create its child runs."""

    def __init__(self, uri: str, study: str, params: dict, tags: dict[str, str],
                 artifact_root: Path | None = None):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        exp = self.client.get_experiment_by_name(EXPERIMENT)
        self.experiment_id = exp.experiment_id if exp else self._create_experiment(artifact_root)
        self.study = study
        self.params = flatten(params)
        self.tags = tags
        self.parent_id = self._find_or_create({TAG_ROLE: "parent"}, f"study {study}", None)

    def _create_experiment(self, artifact_root: Path | None) -> str:
        from mlflow.exceptions import MlflowException

        # An explicit artifact root: MLflow's default (./mlartifacts) is relative to the
        # process that creates the experiment, which may be a scratch dir of `--temp`.
        location = Path(artifact_root).resolve().as_uri() if artifact_root else None
        try:
            return self.client.create_experiment(EXPERIMENT, artifact_location=location)
        except MlflowException:  # another stage process created it meanwhile
            return self.client.get_experiment_by_name(EXPERIMENT).experiment_id

    def _find(self, tags: dict[str, str], unfinished_only: bool):
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in {TAG_STUDY: self.study, **tags}.items())
        runs = self.client.search_runs([self.experiment_id], query, order_by=["attributes.start_time DESC"])
        if unfinished_only:
            runs = [r for r in runs if r.info.status != "FINISHED"]
        return runs[0] if runs else None

    def _find_or_create(self, tags: dict[str, str], name: str, parent_id: str | None) -> str:
        found = self._find(tags, unfinished_only=parent_id is not None)
        if found is not None:
            if found.info.status != "RUNNING":
                self.client.update_run(found.info.run_id, status="RUNNING")
            return found.info.run_id
        all_tags = {TAG_STUDY: self.study, **self.tags, **tags}
        if parent_id is not None:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        self.log_params(run.info.run_id, self.params)
        return run.info.run_id

    def child(self, stage: str, method: str | None = None, seed: int | None = None) -> str:
        """Run id of the (unfinished or new) child run for stage / method / seed."""
        tags = {TAG_ROLE: "child", "stage": stage}
        if method is not None:
            tags["method"] = method
        if seed is not None:
            tags["seed"] = str(seed)
        name = "/".join(str(x) for x in (stage, method, None if seed is None else f"seed{seed}") if x is not None)
        return self._find_or_create(tags, name, self.parent_id)

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit is 100 params
            self.client.log_batch(run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and math.isfinite(float(v))]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def finish(self, run_id: str, ok: bool = True) -> None:
        self.client.set_terminated(run_id, status="FINISHED" if ok else "FAILED")

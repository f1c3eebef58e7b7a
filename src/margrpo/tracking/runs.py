"""MLflow runs of one study: a study run per `dvc repro` / `dvc exp run`, a run per stage.

Everything goes through MlflowClient with explicit run ids, never the fluent "active run":
Prefect runs `.submit()`-ed tasks in worker threads, where the active run is not visible.

A study is identified by `study_id` (git revision + DVC experiment name + params hash):
every stage process of one `dvc exp run` computes the same id, so they find the same parent
run by its tag. A child run is found again by its tags (stage, method, seed) only while it
is unfinished, so a stage killed and rerun keeps logging into the same run, while a
finished stage that reruns (code changed) gets a fresh child.

Runs are not nested (no mlflow.parentRunId): the runs table lists every run with its
columns, and the tags margrpo.study / margrpo.parent_run / dvc.exp_name tie a study together.
The "parent" (margrpo.role = parent) is the study's summary run with its headline numbers.

Run status: the parent is RUNNING while one of its stages runs and FINISHED between stages;
a stage that fails or is killed marks the runs it holds open (its children and the parent)
FAILED or KILLED (`Study.abort`; a stage killed with SIGKILL is handled by the reaper
process of pipeline/reaper.py, which `watcher` tells about every run opened or closed).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Callable

from margrpo.tracking.flatten import flatten

EXPERIMENT = "margrpo-study"
TAG_STUDY = "margrpo.study"
TAG_ROLE = "margrpo.role"
TAG_PARENT = "margrpo.parent_run"
# MLflow 3 opens an experiment on its GenAI traces page unless the experiment says it holds
# model-training runs; with this tag the UI opens on the runs table.
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    "mlflow.note.content": "MAR-GRPO study: one study run per `dvc repro` / `dvc exp run` (name: experiment @ git "
                           "revision; its metrics are the headline scores), one run per stage, method and seed. Saved "
                           "views: add ?viewStateShareKey=studies, =evaluate or =train to this page's address.",
}
ARTIFACTS = "mlartifacts"
# Saved views of the runs table (MLflow 3 "shared view state": an experiment tag read by the
# UI when the URL has ?viewStateShareKey=<key>): the filter, order and the columns to show,
# so the README can link straight to a table of studies, evaluations or training runs.
VIEW_TAG = "mlflow.sharedViewState."
GENEVAL_TAGS = ("single_object", "two_object", "counting", "colors", "position", "color_attr")

# Called with ("open" | "close", run_id) whenever a run is marked RUNNING or terminated.
Watcher = Callable[[str, str], None]


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
    return None if os.environ.get("MLFLOW_TRACKING_URI") else Path(root).resolve() / ARTIFACTS


def params_hash(params_text: str) -> str:
    return hashlib.sha256(params_text.encode()).hexdigest()[:8]


def study_id(root: Path, params_text: str) -> str:
    exp = os.environ.get("DVC_EXP_NAME") or "workspace"
    return f"{git_revision(root)[:10]}-{exp}-{params_hash(params_text)}"


def study_name(exp_name: str, revision: str) -> str:
    """The parent run's name as the runs table shows it: short enough not to be cut."""
    return f"{exp_name} @ {revision[:7]}"


def child_name(stage: str, method: str | None = None, seed: int | None = None) -> str:
    return " ".join(str(x) for x in (stage, method, None if seed is None else f"seed{seed}") if x is not None)


def relocate_artifacts(client, experiment_id: str, location: Path | None) -> None:
    """Point the experiment and its runs at `location` when the repo was copied or moved.

    MLflow stores artifact locations as absolute URIs and has no API to change them; with
    the default sqlite store (the only case with a `location`) the tables are ours, so the
    old prefix is replaced in place. A copied repo then writes into its own mlartifacts/.
    """
    if location is None or not client.tracking_uri.startswith("sqlite:///"):
        return
    new = Path(location).resolve().as_uri()
    old = client.get_experiment(experiment_id).artifact_location.rstrip("/")
    if old == new or not old.startswith("file://") or not old.endswith("/" + ARTIFACTS):
        return
    import sqlite3
    from urllib.parse import urlparse

    db = urlparse(client.tracking_uri).path
    with sqlite3.connect(db) as con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, experiment_id))
        con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                    "WHERE experiment_id = ? AND artifact_uri LIKE ? || '%'",
                    (new, len(old) + 1, experiment_id, old))


def _column(kind: str, key: str) -> str:
    return f"{kind}.`{key}`"  # the UI's column key (makeCanonicalSortKey)


def view_states(targets: list[str]) -> dict[str, dict]:
    """Saved runs-table views: studies (parent runs with each target's headline score and
    each method's gain), evaluate (test-split scores per target), train (final-window means)."""
    knobs = [_column("params", k) for k in ("k", "tau", "num_trajectories", "train.steps", "train.seeds")]

    def view(search: str, columns: list[str]) -> dict:
        return {"searchFilter": search, "orderByKey": "attributes.start_time", "orderByAsc": False,
                "startTime": "ALL", "lifecycleFilter": "Active", "selectedColumns": columns}

    return {
        "studies": view(f"tags.`{TAG_ROLE}` = 'parent'",
                        [_column("tags", "dvc.exp_name"), *knobs]
                        + [_column("metrics", f"overall/{t}") for t in targets]
                        + [_column("metrics", f"gain/{t}") for t in targets if t != "base"]),
        "evaluate": view("tags.stage = 'evaluate'",
                         [_column("tags", "method"), _column("tags", "dvc.exp_name")]
                         + [_column("metrics", k) for k in ("eval/geneval/overall", "eval/t2i/mean", "eval/partial")]
                         + [_column("metrics", f"eval/geneval/{t}") for t in GENEVAL_TAGS]),
        "train": view("tags.stage = 'train'",
                      [_column("tags", "method"), _column("tags", "seed"), _column("tags", "dvc.exp_name")]
                      + [_column("metrics", f"final/{k}") for k in ("reward/mean", "loss/kl", "diag/grad_norm_ar",
                                                                    "time/step")]),
    }


def open_experiment(client, location: Path | None, targets: list[str] | None = None) -> str:
    """The study experiment's id: created with an explicit artifact root, tagged so the UI
    opens on the runs table with the saved views, or found and relocated to this repo."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        # An explicit artifact root: MLflow's default (./mlartifacts) is relative to the
        # process that creates the experiment, which may be a scratch dir of `--temp`.
        uri = Path(location).resolve().as_uri() if location else None
        try:
            exp_id = client.create_experiment(EXPERIMENT, artifact_location=uri)
        except MlflowException:  # another stage process created it meanwhile
            exp_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    else:
        exp_id = exp.experiment_id
        relocate_artifacts(client, exp_id, location)
    current = client.get_experiment(exp_id).tags
    tags = dict(EXPERIMENT_TAGS)
    if targets:
        tags.update({VIEW_TAG + name: json.dumps(state) for name, state in view_states(targets).items()})
    for key, value in tags.items():
        if current.get(key) != value:
            client.set_experiment_tag(exp_id, key, value)
    return exp_id


def find_parent(client, experiment_id: str, study: str):
    """The parent run of a study (newest first), or None."""
    runs = client.search_runs([experiment_id], f"tags.`{TAG_STUDY}` = '{study}' and tags.`{TAG_ROLE}` = 'parent'",
                              order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def headline_metrics(summary: dict) -> dict[str, float]:
    """Flat metrics from reports/summary.json ({"overall": {target: score}, "gain": ...,
    "claims": ...}) for the study's parent run: `overall/mar_grpo`, `gain/grpo`, ..."""
    return {f"{group}/{name}": value for group, values in summary.items() if isinstance(values, dict)
            for name, value in values.items()}


class Study:
    """The parent run of one study and helpers to find or create its child runs."""

    def __init__(self, uri: str, study: str, params: dict, tags: dict[str, str],
                 artifact_root: Path | None = None, name: str | None = None,
                 watcher: Watcher | None = None):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        targets = ["base", *params.get("methods", {})]
        self.experiment_id = open_experiment(self.client, artifact_root, targets)
        self.study = study
        self.params = flatten(params)
        self.tags = tags
        self.watcher = watcher
        self.open_runs: list[str] = []  # runs this process marked RUNNING, parent first
        self.parent_id = self._find_or_create({TAG_ROLE: "parent"}, name or f"study {study}", None)

    def _find(self, tags: dict[str, str], unfinished_only: bool):
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in {TAG_STUDY: self.study, **tags}.items())
        runs = self.client.search_runs([self.experiment_id], query, order_by=["attributes.start_time DESC"])
        if unfinished_only:
            runs = [r for r in runs if r.info.status != "FINISHED"]
        return runs[0] if runs else None

    def _opened(self, run_id: str) -> str:
        self.open_runs.append(run_id)
        if self.watcher:
            self.watcher("open", run_id)
        return run_id

    def _find_or_create(self, tags: dict[str, str], name: str, parent_id: str | None) -> str:
        found = self._find(tags, unfinished_only=parent_id is not None)
        if found is not None:
            if found.info.status != "RUNNING":
                self.client.update_run(found.info.run_id, status="RUNNING")
            return self._opened(found.info.run_id)
        all_tags = {TAG_STUDY: self.study, **self.tags, **tags}
        if parent_id is not None:
            # A tag, not mlflow.parentRunId: the UI folds nested runs under their parent and
            # keeps them folded when a filter (tags.stage = 'evaluate') selects only children.
            all_tags[TAG_PARENT] = parent_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        self.log_params(run.info.run_id, self.params)
        return self._opened(run.info.run_id)

    def child(self, stage: str, method: str | None = None, seed: int | None = None) -> str:
        """Run id of the (unfinished or new) child run for stage / method / seed."""
        tags = {TAG_ROLE: "child", "stage": stage}
        if method is not None:
            tags["method"] = method
        if seed is not None:
            tags["seed"] = str(seed)
        return self._find_or_create(tags, child_name(stage, method, seed), self.parent_id)

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow's batch limit is 100 params
            self.client.log_batch(run_id, params=items[i : i + 100])

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, str(value))

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0, digits: int | None = None) -> None:
        """digits: round (for summary numbers shown in the runs table's narrow columns)."""
        import math
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v) if digits is None else round(float(v), digits), now, step)
                 for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(float(v))]
        for i in range(0, len(items), 1000):
            self.client.log_batch(run_id, metrics=items[i : i + 1000])

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self.client.set_terminated(run_id, status=status)
        if run_id in self.open_runs:
            self.open_runs.remove(run_id)
        if self.watcher:
            self.watcher("close", run_id)

    def close(self) -> None:
        """End of a successful stage: the parent is FINISHED until the next stage reopens it."""
        self.abort("FINISHED")

    def abort(self, status: str) -> None:
        """Mark every run this process still holds open (children first) FAILED / KILLED."""
        for run_id in reversed(list(self.open_runs)):
            try:
                self.finish(run_id, status)
            except Exception:  # noqa: BLE001 - a dead store must not hide the stage's own error
                pass

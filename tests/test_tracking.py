"""MLflow bookkeeping without a pipeline run: where runs land (temp / queued experiments log
to the main repo's store), artifact paths of a moved repo, the saved views and headline
columns, and how a rejected `dvc exp run -S` is undone in params.yaml."""
from __future__ import annotations

from pathlib import Path

from margrpo.tracking.runs import main_repo_root, tracking_uri


def test_temp_and_queued_experiments_log_to_the_main_repo(tmp_path, monkeypatch):
    repo = tmp_path / "study"
    scratch = repo / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    scratch.mkdir(parents=True)
    assert main_repo_root(scratch) == repo.resolve()
    assert main_repo_root(scratch / "sub") == repo.resolve()
    assert main_repo_root(repo) == repo.resolve()
    # a folder merely named like one part of the pattern is left alone
    assert main_repo_root(repo / "tmp" / "exps") == (repo / "tmp" / "exps").resolve()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(main_repo_root(scratch)) == f"sqlite:///{repo.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(Path(scratch)) == "http://127.0.0.1:5000"


def test_override_keys_of_a_dvc_exp_run_command_line():
    from pipeline.restore import _override_values, override_key

    argv = ["/venv/bin/python", "/venv/bin/dvc", "exp", "run", "-S", "k=0.5", "--set-param=+world.seeed=1",
            "-Strain.lr=1e-4", "-S", "other.yaml:x=1", "-S", "params.yaml:tau=0.2"]
    values = _override_values(argv)
    assert [override_key(v) for v in values] == ["k", "world.seeed", "train.lr", None, "tau"]
    assert _override_values(["/venv/bin/dvc", "repro"]) is None
    assert _override_values(["python", "-m", "pipeline.train", "exp", "run"]) is None  # not dvc


def test_revert_keys_keeps_comments_and_other_edits(tmp_path):
    import yaml

    from pipeline.restore import revert_keys

    head = "# study\nk: 0.3   # top-k fraction\ntau: 0.0\nworld:\n  seed: 0\n"
    path = tmp_path / "params.yaml"
    # what `dvc exp run -S k=5 -S +world.seeed=1` leaves, plus the user's own edit of tau
    path.write_text("# study\nk: 5   # top-k fraction\ntau: 0.1\nworld:\n  seed: 0\n  seeed: 1\n")
    revert_keys(path, ["k", "world.seeed"], yaml.safe_load(head))
    text = path.read_text()
    assert yaml.safe_load(text) == {"k": 0.3, "tau": 0.1, "world": {"seed": 0}}
    assert "# top-k fraction" in text and text.startswith("# study")


def test_artifact_paths_follow_a_moved_repo(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from margrpo.tracking.runs import artifact_root, open_experiment

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    client = MlflowClient(tracking_uri=f"sqlite:///{old}/mlflow.db")
    exp_id = open_experiment(client, artifact_root(old), ["base", "grpo"])
    run = client.create_run(exp_id)
    assert run.info.artifact_uri.startswith((old / "mlartifacts").as_uri())
    old.rename(new)  # the repo is moved; its store still names the old folder
    client = MlflowClient(tracking_uri=f"sqlite:///{new}/mlflow.db")
    assert open_experiment(client, artifact_root(new)) == exp_id
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith((new / "mlartifacts").as_uri())
    tags = client.get_experiment(exp_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    assert "metrics.`overall/grpo`" in tags["mlflow.sharedViewState.studies"]


def test_headline_metrics_are_flat_columns():
    from margrpo.tracking.runs import headline_metrics

    summary = {"overall": {"base": 0.45, "grpo": 0.5}, "gain": {"grpo": 0.05}, "claims": {"claim1": 1}, "seeds": 3}
    assert headline_metrics(summary) == {"overall/base": 0.45, "overall/grpo": 0.5, "gain/grpo": 0.05,
                                         "claims/claim1": 1}

"""Where MLflow runs land: temp / queued DVC experiments log to the main repo's store."""
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

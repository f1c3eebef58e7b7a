"""Shared by the pipeline tests: a tiny params profile, a scratch repo, and how to run DVC
and watch its processes there."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]

# Small enough that every stage takes seconds on a shared 2-core machine; two seeds so the
# spread-over-seeds code paths run. One process per stage: starting torchrun's ranks costs
# more than these stages' work (test_pipeline_study's fault test runs train@grpo as two
# ranks under DVC, tests/test_distributed.py trains and evaluates as ranks).
TINY = {
    "runtime": {"nproc": 1},
    "num_trajectories": 2,
    # 32 px images (the world reward's default size) cut into 4 tokens of 16x16 px.
    "world": {"train_prompts_per_tag": 2, "heldout_prompts_per_tag": 1, "test_prompts_per_tag": 1,
              "novel_prompts_per_tag": 1},
    "model": {"patch_size": 16, "width": 32, "depth": 1, "heads": 2, "cond_dim": 16, "head_width": 32, "head_depth": 1},
    "pretrain": {"steps": 3, "batch_size": 8, "warmup_steps": 1, "decay_steps": 1, "log_every": 1, "compile": False},
    "sampling": {"num_ar_steps": 2, "head_steps": 3},
    "train": {"seeds": [0, 1], "steps": 3, "prompts_per_step": 2, "group_size": 2, "loss_ar_steps": 1,
              "loss_head_steps": 2, "loss_head_window": 3, "checkpoint_every": 1, "grad_probe_every": 2},
    # images_per_tag 4: a tag's one test prompt gets two rows of 2 images (the allocation runs).
    "evaluate": {"images_per_prompt": 2, "images_per_tag": 4, "batch_size": 32, "grid_prompts": 3},
}


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out.get(k) or {}, v) if isinstance(v, dict) else v
    return out


def set_in_text(text: str, overrides: dict, prefix: str = "") -> str:
    """YAML text with the values of `overrides` (nested dicts down to one-line values) put
    in place on their lines, every comment, blank line and flow list of the file kept: the
    scratch params.yaml has the layout that DVC's -S rewrite damages."""
    for key, value in overrides.items():
        if isinstance(value, dict):
            text = set_in_text(text, value, f"{prefix}{key}.")
            continue
        section, _, leaf = f"{prefix}{key}".rpartition(".")
        start = 0
        if section:  # the section's block: from its line to the next top-level line
            head = re.search(rf"^{re.escape(section)}:[ \t]*(#.*)?\n", text, re.M)
            assert head, f"params.yaml has no section {section}:"
            start = head.end()
            nxt = re.search(r"^[^\s#]", text[start:], re.M)
            end = start + nxt.start() if nxt else len(text)
        else:
            end = len(text)
        indent = "  " if section else ""
        line = re.compile(rf"^({indent}{re.escape(leaf)}:[ \t]*)([^#\n]*?)([ \t]*#.*)?$", re.M)
        found = line.search(text, start, end)
        assert found, f"params.yaml has no one-line key {prefix}{key}"
        text = text[: found.start(2)] + json.dumps(value) + text[found.end(2):]
    return text


def scratch_repo(dst: Path, overrides: dict) -> Path:
    """Copy the working tree's tracked and untracked-not-ignored files (no venv, no outputs,
    no ablation records) to dst, apply the overrides to params.yaml (its layout and comments
    kept) and commit it, as DVC experiments need."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        # the committed study's ablation records belong to that study, not to this scratch one
        if src.is_file() and not (rel.startswith("reports/ablation/") and rel.endswith(".json")):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    text = (dst / "params.yaml").read_text()
    edited = set_in_text(text, overrides)
    assert yaml.safe_load(edited) == merge(yaml.safe_load(text), overrides)
    (dst / "params.yaml").write_text(edited)
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    commit(dst, "scratch copy")
    return dst


def user_edit(text: str) -> str:
    """params.yaml text with uncommitted edits of a user's: a value (k), a comment that
    DVC's -S rewrite drops (the one below the rewards list) and a first line."""
    edited = re.sub(r"^k: \S+", "k: 0.4", text, count=1, flags=re.M)
    edited = re.sub(r"^train:", "# my note below the rewards list\ntrain:", edited, count=1, flags=re.M)
    assert edited.count("\n") == text.count("\n") + 1 and "\nk: 0.4" in edited
    return "# my own first line\n" + edited


def commit(root: Path, message: str) -> None:
    subprocess.run(GIT + ["add", "-A"], cwd=root, check=True)
    subprocess.run(GIT + ["commit", "-q", "--allow-empty", "-m", message], cwd=root, check=True)


def clone(src: Path, dst: Path) -> Path:
    """A fresh clone: what git has, no DVC cache, no mlflow.db."""
    subprocess.run(["git", "clone", "-q", str(src), str(dst)], check=True)
    return dst


# A Prefect API server shared by the stages of the pipeline tests (prefect_server): each
# stage otherwise starts its own temporary one, 8 s of 18 per tiny stage on 2 busy cores.
SHARED_PREFECT: dict[str, str] = {}


def pipeline_env(root: Path, ephemeral: bool = False) -> dict[str, str]:
    """Environment of a stage run: the venv first on PATH (dvc runs `python -m ...`), the
    default tracking store in the scratch repo, a private Prefect home, one torch thread,
    and the scratch copy's sources first on sys.path (margrpo is installed editable from
    the main tree). ephemeral: each flow starts its own Prefect server, as for a user
    (the shared one otherwise, when prefect_server runs)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL")}
    if not ephemeral:
        env.update(SHARED_PREFECT)
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        "PREFECT_HOME": str(root / ".prefect-home"),
        "PYTHONPATH": str(root / "src"),
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "DVC_NO_ANALYTICS": "1",
    })
    return env


def run(root: Path, *cmd: str, check: bool = True, timeout: float = 600,
        ephemeral: bool = False) -> subprocess.CompletedProcess:
    """A command in the scratch repo; `dvc` and `python` resolve to the venv's."""
    proc = subprocess.run(list(cmd), cwd=root, env=pipeline_env(root, ephemeral), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def dvc(root: Path, *args: str, check: bool = True) -> str:
    proc = run(root, "dvc", *args, check=check)
    return proc.stdout + proc.stderr


def ran_stages(output: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", output))


@contextlib.contextmanager
def prefect_server(home: Path):
    """`prefect server start` on a free local port for the duration; stages find it through
    PREFECT_API_URL (pipeline_env)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "DO_NOT_TRACK": "true", "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("PREFECT_API_URL", None)
    server = subprocess.Popen([str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"

    def healthy():
        assert server.poll() is None, "prefect server start exited"
        try:
            return urllib.request.urlopen(f"{url}/health", timeout=2).status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 120, "the shared Prefect server", poll=0.5)
        SHARED_PREFECT["PREFECT_API_URL"] = url
        yield url
    finally:
        SHARED_PREFECT.clear()
        os.killpg(server.pid, signal.SIGTERM)  # its own session: the server and its workers
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def git_changes(root: Path) -> list[str]:
    """`git status --porcelain` lines: committed files changed, deleted or added."""
    out = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def runs(root: Path, exclude: set[str] = frozenset()) -> list[tuple[str, str, dict]]:
    """(name, status, tags) of every MLflow run in root/mlflow.db, oldest first, except the
    run ids in `exclude` (see run_ids)."""
    if not (root / "mlflow.db").exists():
        return []
    with sqlite3.connect(root / "mlflow.db") as db:
        rows = db.execute("select run_uuid, name, status from runs order by start_time").fetchall()
        tags = db.execute("select run_uuid, key, value from tags").fetchall()
    by_run: dict[str, dict] = {}
    for run_id, key, value in tags:
        by_run.setdefault(run_id, {})[key] = value
    return [(name, status, by_run.get(run_id, {})) for run_id, name, status in rows if run_id not in exclude]


def run_ids(root: Path) -> set[str]:
    if not (root / "mlflow.db").exists():
        return set()
    with sqlite3.connect(root / "mlflow.db") as db:
        return {r for (r,) in db.execute("select run_uuid from runs")}


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def locked_params(root: Path, stage: str) -> dict:
    return yaml.safe_load((root / "dvc.lock").read_text())["stages"][stage]["params"]["params.yaml"]


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())

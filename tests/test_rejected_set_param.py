"""A rejected `dvc exp run -S` costs nothing: for each of many bad values the guard
(pipeline/validate.py) names the key and the fix within 5 s, params.yaml is byte for byte
what it was before the command (list indices, comments, flow lists and `null` included,
and the user's own uncommitted edits), and no other file is deleted or changed.

The scratch repo holds the shipped params.yaml, dvc.yaml and base model. Each case does to
it what a workspace `dvc exp run -S` does before its first stage (DVC 3.67, measured; see
pipeline/restore.py): stash the uncommitted changes in a commit that is dropped again, and
rewrite the file with DVC's own writer. Then the guard runs in-process, as its stage
would. tests/test_pipeline_study.py runs the real `dvc exp run` on a few of these.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from margrpo import paramfile
from pipeline import restore, validate
from pipeline_tiny import GIT, REPO, commit, user_edit

SHIPPED = (REPO / "params.yaml").read_text()

# (-S values, text the guard's message must hold: the key and what is wrong)
REJECTED = [
    # list entries by index
    (["rewards.0.weight=0"], "rewards.0.weight: weight 0 turns this reward off"),
    (["rewards.0.name=nope"], "rewards.0.name: unknown reward 'nope'"),
    (["rewards.0.mode=algined"], "rewards.0.mode: 'algined' is not one of"),
    (["+rewards.0.mod=partial"], "rewards.0.mod: unknown key for reward 'world'"),
    (["rewards.0.weight=inf"], "rewards.0.weight: Input should be a finite number"),
    (["train.seeds.0=-1"], "train.seeds.0: Input should be greater than or equal to 0"),
    (["train.seeds.1=0"], "repeats a seed"),
    (["train.adam_betas.1=2"], "train.adam_betas.1: Input should be less than 1"),
    (["train.adam_betas.0=-0.1"], "train.adam_betas.0: Input should be greater than or equal to 0"),
    # types
    (["train.lr=fast"], "train.lr: Input should be a valid number"),
    (["train.steps=sixty"], "train.steps: Input should be a valid integer"),
    (["evaluate.seed=1.5"], "evaluate.seed: Input should be a valid integer"),
    (["train.cfg_consistent=maybe"], "train.cfg_consistent: Input should be a valid boolean"),
    (["train.seeds=7"], "train.seeds: Input should be a valid list"),
    (["model.patch_size=[8]"], "model.patch_size: Input should be a valid integer"),
    # ranges and allowed values
    (["k=2"], "k: Input should be less than or equal to 1"),
    (["tau=-2"], "tau: Input should be greater than or equal to -1"),
    (["num_trajectories=0"], "num_trajectories: Input should be greater than or equal to 1"),
    (["train.group_size=1"], "train.group_size: Input should be greater than or equal to 2"),
    (["train.lr=inf"], "train.lr: Input should be a finite number"),
    (["pretrain.ema_decay=1"], "pretrain.ema_decay: Input should be less than 1"),
    (["model.sampler=ddim"], "model.sampler: Input should be 'ddpm' or 'flow'"),
    (["methods.mar_grpo.estimator=magic"], "methods.mar_grpo.estimator: Input should be 'single'"),
    (["runtime.dtype=float16"], "runtime.dtype: Input should be 'float32' or 'bfloat16'"),
    # unknown and missing keys
    (["+foo=1"], "foo: unknown key"),
    (["+world.seeed=1"], "world.seeed: unknown key"),
    (["+methods.mar_grpo.topkk=true"], "methods.mar_grpo.topkk: unknown key"),
    (["+runtime.gpus=2"], "runtime.gpus: unknown key"),
    (["~methods.grpo.freeze_head"], "methods.grpo.freeze_head: missing"),
    # cross-field rules of margrpo.config
    (["train.loss_head_window=3"], "train.loss_head_window: 3 is outside"),
    (["world.image_size=36"], "world.image_size: 36 is not divisible by model.patch_size="),
    (["sampling.num_ar_steps=17"], "sampling.num_ar_steps: 17 exceeds the"),
    (["pretrain.decay_steps=9000"], "pretrain.decay_steps: 9000 exceeds pretrain.steps="),
    (["train.loss_ar_steps=5"], "train.loss_ar_steps: 5 exceeds sampling.num_ar_steps="),
    (["+model.lora_rank=4"], "model.lora_rank: applies to model.kind nova or harmon only"),
    (["model.kind=nova"], "model.weights: missing: model.kind=nova needs the published nova folder"),
    (["model.kind=nova", "model.weights=/nonexistent/nova"], "model.weights: /nonexistent/nova: no such folder"),
    (["model.checkpoint=models/nonexist"], "model.checkpoint: models/nonexist: no such folder"),
    (["rewards=[{name:nope,weight:1.0}]"], "rewards.0.name: unknown reward 'nope'"),
    # what dvc.yaml's train stages list (written from params.yaml by python -m pipeline.dvcyaml):
    # a -S cannot add a method or change the knobs one reads
    (["+methods.grpo.topk=true"], "train@grpo lists no knob but its settings read k, num_trajectories"),
    (["+methods.extra={freeze_head:true,topk:true}"], "no stage train@extra"),
    (["+methods.grpo.reads=[k,train,train]"], "methods.grpo.reads: is not a setting"),
    # the report's roles
    (["claims.resample=grpo"], "claims.resample: grpo does not have the settings of the role (estimator: single)"),
    # rules the stages' code enforced only once running (validate.params_rules)
    (["runtime.nproc=3"], "runtime.nproc: 3 ranks cannot split the prompts of a training step"),
    (["runtime.nproc=32"], "runtime.nproc: 32 ranks cannot split"),
    # (with runtime.nproc auto, 15 prompts per step run as one rank: only a set count is refused)
    (["runtime.nproc=2", "train.prompts_per_step=15"], "ranks cannot split the prompts of a training step (15 for grpo"),
    (["model.heads=5"], "model.heads: 5 heads do not divide model.width="),
    (["model.max_prompt_len=8"], "model.max_prompt_len: 8 words is shorter than the world's longest prompts"),
    (["model.patch_size=3", "world.image_size=33"], "world.image_size: 33 is odd"),
]
# Also run with uncommitted edits of the user's in params.yaml: a value that the -S then
# overrides (k), a comment DVC's rewrite drops (the one below the rewards list) and another.
DIRTY = ["rewards.0.weight=0", "k=2", "train.seeds.0=-1", "train.adam_betas.1=2", "runtime.nproc=3", "+foo=1"]
CASES = [(v, e, False) for v, e in REJECTED] + [(v, e, True) for v, e in REJECTED if v[0] in DIRTY]


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("rejected") / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(SHIPPED)
    for rel in ("dvc.yaml", "reports/validated.txt"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, root / rel)
    shutil.copytree(REPO / "models/base", root / "models/base")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    commit(root, "scratch copy")
    return root


def git(root: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=root, capture_output=True, text=True, check=True).stdout


def dvc_exp_run_rewrite(root: Path, values: list[str]) -> float:
    """What a workspace `dvc exp run -S values` does before its first stage; its start time."""
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    started = time.time()
    if git(root, "status", "--porcelain"):
        git(root, "stash", "push", "-q")
        git(root, "stash", "pop", "-q")
    for path, overrides in to_path_overrides(values).items():
        apply_overrides(root / path, overrides)
    return started


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file but params.yaml and git's: (mtime, sha256)."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in root.rglob("*") if p.is_file() and ".git" not in p.parts and p.name != "params.yaml"}


@pytest.mark.parametrize("values, expect, dirty", CASES,
                         ids=[" ".join(v) + (" (uncommitted edits)" if d else "") for v, _, d in CASES])
def test_rejected_value_is_named_and_leaves_every_byte(repo, monkeypatch, values, expect, dirty):
    monkeypatch.chdir(repo)
    git(repo, "checkout", "--", "params.yaml")
    params = repo / "params.yaml"
    if dirty:
        params.write_text(user_edit(SHIPPED))
    before, files = params.read_bytes(), snapshot(repo)
    started = dvc_exp_run_rewrite(repo, values)
    assert params.read_bytes() != before  # DVC rewrote it

    rewrite = params.read_text()
    t0 = time.perf_counter()  # the guard's work (validate.main less its imports)
    problems, _, _ = validate.problems_of(Path("params.yaml"))
    done = restore.restore_after_exp_run(values, started)
    shown = validate.relocated(Path("params.yaml"), rewrite, [v.partition("=")[0].lstrip("+~") for v in values])
    seconds = time.perf_counter() - t0

    message = "\n".join(shown)
    assert problems and expect in message, message
    assert "fix" in message or "add `" in message, message
    # a key is placed at its line in the file as it now is, or shown as the -S value
    _, lines = paramfile.read_yaml(params)
    for line, key in re.findall(r"params\.yaml:(\d+): ([\w.]+):", message):
        path = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        assert lines.get(path, int(line)) == int(line), (key, line, message)
    assert params.read_bytes() == before, done
    assert done == [f"params.yaml: put back byte for byte as it was before this `dvc exp run` (DVC had written "
                    f"{', '.join(v.partition('=')[0].lstrip('+~') for v in values)} into it)"]
    assert snapshot(repo) == files
    assert seconds <= 5, f"the guard took {seconds:.1f} s"


def test_rewrite_replayed_on_a_changed_file_falls_back_to_the_keys(repo, monkeypatch):
    """Edited after DVC wrote it, the file matches no source: the -S keys alone go back
    (to the value before the command), the other edit stays, and the message says so."""
    import yaml

    monkeypatch.chdir(repo)
    git(repo, "checkout", "--", "params.yaml")
    params = repo / "params.yaml"
    started = dvc_exp_run_rewrite(repo, ["rewards.0.weight=0", "train.seeds.2=-5"])
    params.write_text(re.sub(r"^tau: \S+", "tau: 0.25", params.read_text(), count=1, flags=re.M))
    done = restore.restore_after_exp_run(["rewards.0.weight=0", "train.seeds.2=-5"], started)
    after, shipped = yaml.safe_load(params.read_text()), yaml.safe_load(SHIPPED)
    assert after == {**shipped, "tau": 0.25}
    assert len(done) == 1 and "DVC's rewrite also changed the file's layout" in done[0], done


def test_the_guard_process_under_a_dvc_exp_run(repo, tmp_path):
    """`python -m pipeline.validate` as DVC runs it: exit 2, a few lines, the file put back,
    in at most 5 s from a cold start; the -S values are read from the parent `dvc exp run`."""
    fake = tmp_path / "bin" / "dvc"  # its command line is `python .../dvc exp run -S ...`
    fake.parent.mkdir()
    fake.write_text(
        "import os, subprocess, sys, time\n"
        "from dvc.utils.cli_parse import to_path_overrides\n"
        "from dvc.utils.hydra import apply_overrides\n"
        "values = [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == '-S']\n"
        "for path, overrides in to_path_overrides(values).items():\n"
        "    apply_overrides(path, overrides)\n"
        "t0 = time.perf_counter()\n"
        "env = {**os.environ, 'DVC_EXP_NAME': 'x'}\n"
        "rc = subprocess.run([sys.executable, '-m', 'pipeline.validate'], env=env).returncode\n"
        "print(f'guard seconds: {time.perf_counter() - t0:.2f}')\n"
        "sys.exit(rc)\n")
    git(repo, "checkout", "--", "params.yaml")
    before = (repo / "params.yaml").read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")])}
    env.pop("DVC_STAGE", None)
    proc = subprocess.run([sys.executable, str(fake), "exp", "run", "-S", "runtime.nproc=3"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "params.yaml (override runtime.nproc=3): runtime.nproc: 3 ranks cannot split" in err, err
    assert "fix: set runtime.nproc to one of 1, 2, 4" in err and "Traceback" not in err, err
    assert "validate: params.yaml: put back byte for byte" in err and len(err.splitlines()) <= 8, err
    assert (repo / "params.yaml").read_bytes() == before
    seconds = float(proc.stdout.rpartition("guard seconds: ")[2])
    assert seconds <= 5, f"the guard took {seconds:.1f} s"

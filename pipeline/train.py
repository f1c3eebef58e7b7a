"""Stage train@<method>: RL fine-tuning of the base model, one run per seed in train.seeds.

`python -m pipeline.train --method mar_grpo`. Per seed, the trainer works in a checkpoint
folder outside the DVC outputs (`checkpoint_dir`, defined here so that a change of what
decides resumption is a change of this stage's code) and resumes from its ckpt.pt, so a
killed `dvc repro` picks up where it stopped. Outputs:
- models/rl/<method>/seed<s>/final/ and best/: the model after the last step and the one
  with the best held-out score during training (DVC cache);
- reports/train/<method>/trained.json: which training run made them (MLflow run ids, time);
- reports/train/<method>/seeds/seed<s>/: history.jsonl (one row per step), evals.jsonl
  (held-out scores during training) and selection_examples.pt (uncertainty / selection maps,
  when the method has them), in git, replaced for all seeds at once when every seed has
  finished;
- reports/train/<method>/curves.csv: per-step metrics averaged over seeds (a DVC plot);
- reports/train/<method>/metrics.json: final-window means over seeds (DVC metrics).

Data parallel over runtime.nproc ranks per node (and runtime.nnodes nodes): every rank runs
this flow and trains the same seeds in the same order, each on its block of whole groups of
every step's prompts (margrpo/ranks/distributed.py); rank 0 alone logs to MLflow and writes.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from pipeline import common, proc

METHOD_HELP = "a key of params.yaml `methods`"
# Training checkpoints live outside every DVC output (DVC deletes outputs before a stage
# reruns), in a folder keyed by everything that determines training, so a rerun after a
# kill resumes and a rerun with other params starts fresh. The folder is the main
# repository's (common.tracking_root): a queued or --temp experiment runs in a scratch copy
# that DVC deletes when the experiment ends or fails, and its rerun resumes from here.
CHECKPOINTS = Path("outputs/ckpt")


def checkpoint_dir(params, method: str, seed: int) -> Path:
    """outputs/ckpt/<method>/<key>/seed<seed>, the folder a run resumes from: key hashes what
    determines the training run (train.seeds excluded: adding a seed must not discard the
    others' checkpoints)."""
    from margrpo.config import IN_TRAIN

    resolved = params.method(method)
    # The method's step count, batch, LR schedule and probe interval are in "train"
    # (train_for); paired_base only adds a measurement, so it enters the key only when set (a run
    # without it has the key of a method block that does not name it). The knob values it runs
    # with (k, tau, num_trajectories) are keyed.
    unkeyed = set(IN_TRAIN) | (set() if resolved.paired_base else {"paired_base"})
    spec = {
        "method": resolved.model_dump(mode="json", exclude=unkeyed),
        "train": params.train_for(method).model_dump(mode="json", exclude={"seeds"}),
        "sampling": params.sampling.model_dump(mode="json"),
        "rewards": [r.model_dump(mode="json") for r in params.rewards],
        "model": params.model.model_dump(mode="json", exclude={"checkpoint"}),
        "image_size": params.world.image_size,
        "base": file_digest(Path(params.model.checkpoint)),
        "prompts": file_digest(common.TRAIN_PROMPTS),
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return common.tracking_root() / CHECKPOINTS / method / key / f"seed{seed}"


def file_digest(path: Path) -> str:
    """sha256 of a file, or of every file under a folder (names and contents)."""
    h = hashlib.sha256()
    files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
    for f in files:
        h.update(str(f.relative_to(path) if Path(path).is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@proc.task()
def train_seed(params, method: str, seed: int, study, run_id: str | None) -> Path:
    """Train (or resume) one seed on every rank; returns its checkpoint folder. study and
    run_id: rank 0's MLflow study and this seed's run (None on the other ranks)."""
    from margrpo.jsonl import read_jsonl
    from margrpo.study import train_run

    out_dir = checkpoint_dir(params, method, seed)
    if study is not None and (out_dir / "ckpt.pt").exists():
        done = sum(1 for line in open(out_dir / "history.jsonl")) if (out_dir / "history.jsonl").exists() else 0
        print(f"train {method} seed {seed}: resuming from the checkpoint in {out_dir} "
              f"(history has {done} of {params.train_for(method).steps} steps; the trainer drops any after the checkpoint)")
    train_run(
        params, method, seed, out_dir,
        train_prompts=read_jsonl(common.TRAIN_PROMPTS),
        heldout_prompts=read_jsonl(common.HELDOUT_PROMPTS),
        log=None if study is None else (lambda step, metrics: study.log_metrics(run_id, metrics, step)),
        progress=True,
    )
    return out_dir


def publish_seed(study, run_id: str, method: str, seed: int, ckpt_dir: Path, seconds: float, steps: int) -> None:
    """Rank 0, after a seed: its model into models/rl (DVC cache, not in git; DVC deleted the
    folder before the stage), and its wall time and final-window means into its MLflow run."""
    from margrpo.report.curves import final_window, read_history

    model = common.trained_model_dir(method, seed)
    for name in ("final", "best"):
        if (ckpt_dir / name).exists():
            shutil.copytree(ckpt_dir / name, model / name, dirs_exist_ok=True)
    history = read_history(ckpt_dir / "history.jsonl")
    study.log_metrics(run_id, {"time/train_wall_s": seconds}, steps)
    # Final-window means as their own metrics: columns of the MLflow runs table.
    study.log_metrics(run_id, {f"final/{k}": v for k, v in final_window({seed: history})["final_window"]["mean"].items()},
                      steps)
    study.log_artifact(run_id, ckpt_dir / "history.jsonl", "train")
    study.finish(run_id)


def publish_records(method: str, ckpt_dirs: dict[int, Path]) -> None:
    """Copy every seed's history and selection maps into reports/train/<method>/seeds/ at
    once (a git-tracked, persistent output: a kill before this leaves the committed ones)."""
    dest = common.REPORTS / "train" / method / "seeds"
    staged = common.staging_dir(dest)
    for seed, ckpt_dir in ckpt_dirs.items():
        record = staged / f"seed{seed}"
        record.mkdir(parents=True)
        for name in ("history.jsonl", "evals.jsonl", "selection_examples.pt"):
            if (ckpt_dir / name).exists():
                shutil.copy2(ckpt_dir / name, record / name)
    common.replace_dir(staged, dest)


def publish_method(study, method: str, ckpt_dirs: dict[int, Path], run_ids: dict[int, str], steps: int) -> None:
    """Rank 0, after every seed: the records, curves, metrics and trained.json of the method."""
    from margrpo.report.curves import curve_csv, final_window, mean_curve, read_history

    histories = {seed: read_history(d / "history.jsonl") for seed, d in ckpt_dirs.items()}
    publish_records(method, ckpt_dirs)
    out = common.REPORTS / "train" / method
    common.write_text(curve_csv(mean_curve(list(histories.values()))), out / "curves.csv")
    summary = final_window(histories)
    common.write_json(summary, out / "metrics.json")
    run_id = study.child("train", method)
    # Names this training run: evaluate@<method> depends on it, so it reruns after every
    # retraining, and its MLflow run links back to these runs.
    common.write_json({"method": method, "seeds": list(ckpt_dirs), "mlflow_runs": {str(s): r for s, r in run_ids.items()},
                       "mlflow_method_run": run_id, "study": study.study, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")},
                      out / "trained.json")
    study.log_metrics(run_id, {f"final/{k}": v for k, v in summary["final_window"]["mean"].items()}, steps)
    study.log_artifact(run_id, out, "train")
    study.finish(run_id)


@proc.flow("train")
def train_method(method: str) -> None:
    params = common.load()
    t = params.train_for(method)
    study = None
    if proc.is_rank0():
        print(f"train {method}: {len(t.seeds)} seed(s) x {t.steps} steps x {t.prompts_per_step} prompts "
              f"x {t.group_size} images = {t.steps * t.prompts_per_step * t.group_size} rollouts per seed; "
              f"method {params.method(method).model_dump()}")
        study = proc.open_study(params)
    ckpt_dirs, run_ids = {}, {}
    for seed in t.seeds:
        run_id = run_ids[seed] = study.child("train", method, seed) if study is not None else None
        t0 = time.time()
        ckpt_dirs[seed] = train_seed(params, method, seed, study, run_id)
        if study is not None:
            publish_seed(study, run_id, method, seed, ckpt_dirs[seed], time.time() - t0, t.steps)
    if study is not None:
        publish_method(study, method, ckpt_dirs, run_ids, t.steps)


if __name__ == "__main__":
    proc.main("train", train_method, key=("method", METHOD_HELP), doc=__doc__, ranks=True)

"""Stage train@<method>: RL fine-tuning of the base model, one run per seed in train.seeds.

`python -m pipeline.train --method mar_grpo`. Per seed, the trainer works in a checkpoint
folder outside the DVC outputs (common.checkpoint_dir) and resumes from its ckpt.pt, so a
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

With runtime.nproc > 1 the stage runs as that many torchrun ranks (data parallel,
margrpo/rl/distributed.py): rank 0 runs the flow (MLflow, files), the others train the same
seeds in the same order (`follow`); every rank takes whole groups of each step's prompts.
"""
from pipeline.common import preamble, start_ranks_early

preamble()

METHOD_HELP = "a key of params.yaml `methods`"
if __name__ == "__main__":  # the stage's own process starts the ranks and exits here
    from margrpo.rl.launch import check_shardable

    start_ranks_early("train", "method", METHOD_HELP, __doc__, "pipeline.train",
                      check=lambda p, method: check_shardable(p.train_for(method).prompts_per_step, p.runtime.nproc))

import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402


def run_seed(params, method: str, seed: int, log=None) -> Path:
    """Train (or resume) one seed; returns its checkpoint folder. Every rank calls it alike."""
    from margrpo.study import train_run
    from margrpo.jsonl import read_jsonl

    out_dir = common.checkpoint_dir(params, method, seed)
    train_run(
        params, method, seed, out_dir,
        train_prompts=read_jsonl(common.TRAIN_PROMPTS),
        heldout_prompts=read_jsonl(common.HELDOUT_PROMPTS),
        log=log,
        progress=True,
    )
    return out_dir


@task(cache_policy=NO_CACHE)
def train_seed(params, method: str, seed: int, study, run_id: str) -> Path:
    """run_seed with MLflow logging (rank 0)."""
    out_dir = common.checkpoint_dir(params, method, seed)
    if (out_dir / "ckpt.pt").exists():
        done = sum(1 for line in open(out_dir / "history.jsonl")) if (out_dir / "history.jsonl").exists() else 0
        print(f"train {method} seed {seed}: resuming from the checkpoint in {out_dir} "
              f"(history has {done} of {params.train_for(method).steps} steps; the trainer drops any after the checkpoint)")
    return run_seed(params, method, seed, log=lambda step, metrics: study.log_metrics(run_id, metrics, step))


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


@flow(name="train")
def train_method(method: str) -> None:
    from margrpo.report.curves import curve_csv, final_window, mean_curve, read_history

    params = common.load()
    resolved = params.method(method)
    t = params.train_for(method)
    print(f"train {method}: {len(t.seeds)} seed(s) x {t.steps} steps x {t.prompts_per_step} prompts "
          f"x {t.group_size} images = {t.steps * t.prompts_per_step * t.group_size} rollouts per seed; "
          f"method {resolved.model_dump()}")
    study = common.open_study(params)
    ckpt_dirs, run_ids = {}, {}
    for seed in t.seeds:
        run_ids[seed] = run_id = study.child("train", method, seed)
        t0 = time.time()
        ckpt_dirs[seed] = train_seed(params, method, seed, study, run_id)
        # The model (DVC cache, not in git) is published per seed; DVC deleted the folder.
        model = common.trained_model_dir(method, seed)
        for name in ("final", "best"):
            if (ckpt_dirs[seed] / name).exists():
                shutil.copytree(ckpt_dirs[seed] / name, model / name, dirs_exist_ok=True)
        history = read_history(ckpt_dirs[seed] / "history.jsonl")
        study.log_metrics(run_id, {"time/train_wall_s": time.time() - t0}, t.steps)
        # Final-window means as their own metrics: columns of the MLflow runs table.
        study.log_metrics(run_id, {f"final/{k}": v for k, v in final_window({seed: history})["final_window"]["mean"].items()},
                          t.steps)
        study.log_artifact(run_id, ckpt_dirs[seed] / "history.jsonl", "train")
        study.finish(run_id)
    histories = {seed: read_history(d / "history.jsonl") for seed, d in ckpt_dirs.items()}
    publish_records(method, ckpt_dirs)
    out = common.REPORTS / "train" / method
    common.write_text(curve_csv(mean_curve(list(histories.values()))), out / "curves.csv")
    summary = final_window(histories)
    common.write_json(summary, out / "metrics.json")
    run_id = study.child("train", method)
    # Names this training run: evaluate@<method> depends on it, so it reruns after every
    # retraining, and its MLflow run links back to these runs.
    common.write_json({"method": method, "seeds": list(t.seeds), "mlflow_runs": {str(s): r for s, r in run_ids.items()},
                       "mlflow_method_run": run_id, "study": study.study, "finished": time.strftime("%Y-%m-%dT%H:%M:%S")},
                      out / "trained.json")
    study.log_metrics(run_id, {f"final/{k}": v for k, v in summary["final_window"]["mean"].items()}, t.steps)
    study.log_artifact(run_id, out, "train")
    study.finish(run_id)


def follow(method: str) -> None:
    """Ranks > 0: the seeds of rank 0's flow, in the same order, without its files or MLflow."""
    params = common.load()
    for seed in params.train.seeds:
        run_seed(params, method, seed)


def main() -> None:
    common.run_keyed("train", "method", METHOD_HELP, launch, __doc__)


def launch(method: str) -> None:
    from margrpo.rl.distributed import check_shardable, run_stage

    params = common.load()
    # validate refuses this before any stage starts; here for direct callers
    check_shardable(params.train_for(method).prompts_per_step, params.runtime.nproc)
    run_stage(params.runtime, "pipeline.train", lambda: train_method(method), lambda: follow(method))


if __name__ == "__main__":
    main()

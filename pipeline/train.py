"""Stage train@<method>: RL fine-tuning of the base model, one run per seed in train.seeds.

`python -m pipeline.train --method mar_grpo`. Per seed, the trainer works in a checkpoint
folder outside the DVC outputs (common.checkpoint_dir) and resumes from its ckpt.pt, so a
killed `dvc repro` picks up where it stopped. Outputs:
- models/rl/<method>/seed<s>/final/: the trained model (DVC cache);
- reports/train/<method>/seeds/seed<s>/: history.jsonl (one row per step) and
  selection_examples.pt (uncertainty / selection maps, when the method has them), in git;
- reports/train/<method>/curves.csv: per-step metrics averaged over seeds (a DVC plot);
- reports/train/<method>/metrics.json: final-window means over seeds (DVC metrics).
"""
from pipeline.common import preamble

preamble()

import argparse  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402


@task(cache_policy=NO_CACHE)
def train_seed(params, method: str, seed: int, study, run_id: str) -> Path:
    """Train (or resume) one seed; returns its checkpoint folder."""
    from margrpo.rl.trainer import train
    from margrpo.world.prompts import read_jsonl

    out_dir = common.checkpoint_dir(params, method, seed)
    if (out_dir / "ckpt.pt").exists():
        done = sum(1 for line in open(out_dir / "history.jsonl")) if (out_dir / "history.jsonl").exists() else 0
        print(f"train {method} seed {seed}: resuming from the checkpoint in {out_dir} "
              f"(history has {done} of {params.train.steps} steps; the trainer drops any after the checkpoint)")
    train(
        params, method, seed, out_dir,
        base_checkpoint=Path(params.model.checkpoint),
        train_prompts=read_jsonl(common.TRAIN_PROMPTS),
        log=lambda step, metrics: study.log_metrics(run_id, metrics, step),
        progress=True,
    )
    return out_dir


def publish(ckpt_dir: Path, model_dest: Path, record_dest: Path) -> None:
    """Copy what later stages read from the checkpoint folder into the DVC outputs."""
    model_dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ckpt_dir / "final", model_dest / "final", dirs_exist_ok=True)
    record_dest.mkdir(parents=True, exist_ok=True)
    for name in ("history.jsonl", "selection_examples.pt"):
        if (ckpt_dir / name).exists():
            shutil.copy2(ckpt_dir / name, record_dest / name)


@flow(name="train")
def train_method(method: str) -> None:
    from margrpo.report.curves import final_window, mean_curve, read_history, write_curve_csv

    params = common.load()
    resolved = params.method(method)
    t = params.train
    print(f"train {method}: {len(t.seeds)} seed(s) x {t.steps} steps x {t.prompts_per_step} prompts "
          f"x {t.group_size} images = {t.steps * t.prompts_per_step * t.group_size} rollouts per seed; "
          f"method {resolved.model_dump()}")
    study = common.open_study(params)
    histories = {}
    for seed in t.seeds:
        run_id = study.child("train", method, seed)
        t0 = time.time()
        ckpt_dir = train_seed(params, method, seed, study, run_id)
        record = common.train_record_dir(method, seed)
        publish(ckpt_dir, common.trained_model_dir(method, seed), record)
        histories[seed] = read_history(record / "history.jsonl")
        study.log_metrics(run_id, {"time/train_wall_s": time.time() - t0}, t.steps)
        study.log_artifact(run_id, record / "history.jsonl", "train")
        study.finish(run_id)
    out = common.REPORTS / "train" / method
    write_curve_csv(mean_curve(list(histories.values())), out / "curves.csv")
    common.write_json(final_window(histories), out / "metrics.json")
    run_id = study.child("train", method)
    study.log_metrics(run_id, final_window(histories)["final_window"]["mean"], t.steps)
    study.log_artifact(run_id, out, "train")
    study.finish(run_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", required=True, help="a key of params.yaml `methods`")
    train_method(parser.parse_args().method)


if __name__ == "__main__":
    main()

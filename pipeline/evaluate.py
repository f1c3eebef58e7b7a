"""Stages evaluate_base and evaluate@<method>: score the base / a trained method on the test world prompts.

`python -m pipeline.evaluate --target grpo`. The test split is used only here: training
selects its best checkpoint on the held-out split. One replicate per seed in train.seeds:
for a trained method, replicate s scores the final and the best model trained with seed s;
for `base`, the one base model. Replicate s samples evaluate.images_per_prompt images per prompt, more for
the prompts of a GenEval tag with few prompts (evaluate.images_per_tag; world/generate.py allocate_images),
with the same per-image seeds for every target, so targets differ only in their weights. Outputs under
reports/eval/<target>/: metrics.json (mean and std over replicates; DVC metrics),
per_seed.json (each replicate's summary), per_seed_best.json (the same for the best
checkpoints, not resampled where best/ is final/; methods only, {} for base), per_prompt.json
(every prompt's mean score per seed, final and best: the report's intervals over seeds and
prompts), scores.csv (mean
score per GenEval tag and T2I category; a DVC bar plot) and grid.png (replicate 0,
evaluate.grid_prompts prompts across tags; a DVC image plot).

Data parallel over runtime.nproc ranks per node (and runtime.nnodes nodes): every rank runs
this flow; each replicate's sampling and scoring is shared over them
(margrpo.study.sample_and_score) with exactly the single-process per-image scores, and rank
0 alone logs to MLflow and writes.
"""
from __future__ import annotations

import itertools
import json
import time

from pipeline import common, proc

TARGET_HELP = "base or a key of params.yaml `methods`"


@proc.task()
def replicate_scores(params, model_path, metas: list[dict], replicate: int, desc: str, grid: bool):
    """(summary metrics, per-prompt scores, grid image or None) of one replicate, scored by
    the evaluation judge (and the reward's detector as proxy_*); every rank calls it alike."""
    import torch

    from margrpo.models.loading import load_model
    from margrpo.study import sample_and_score
    from margrpo.world.generate import (expand_prompts, fold_rows, grid_prompt_indices, image_grid, image_seeds,
                                        per_prompt, summarize)
    from margrpo.world.judge import JudgedEvaluator

    model = load_model(model_path, params)
    e = params.evaluate
    k = e.images_per_prompt
    # A prompt with more images (evaluate.images_per_tag) is sampled as several rows of k.
    rows_meta, repeats = expand_prompts(metas, k, e.images_per_tag)
    first = [0, *itertools.accumulate(repeats)]                      # each prompt's first row
    seeds = image_seeds(e.seed, replicate, len(rows_meta), k)
    shown = grid_prompt_indices(metas, e.grid_prompts) if grid else []
    keep = [first[p] * k + j for p in shown for j in range(k)]
    scores, kept = sample_and_score(model, rows_meta, seeds, e.batch_size, JudgedEvaluator(params.world.image_size),
                                    keep=keep, progress=True, desc=desc)
    picture = None
    if grid:
        images = torch.stack([kept[i] for i in keep]).unflatten(0, (len(shown), k))
        picture = image_grid(images, [metas[p]["prompt"] for p in shown])
    return summarize(scores), fold_rows(per_prompt(scores, len(rows_meta)), repeats), picture


def prompt_rows(metas: list[dict]) -> list[dict]:
    """The per-prompt file's prompt list: text, tag, category, test subset and the size of
    the prompt space it was drawn from (the report does not resample a space listed whole)."""
    from margrpo.world.prompts import combinations

    def pool(m: dict) -> int:
        return len(combinations(m.get("tag") or m["category"], "novel" if m.get("subset") == "novel" else "test"))

    return [{"prompt": m["prompt"], "tag": m.get("tag"), "category": m.get("category"),
             "subset": m.get("subset", "test"), "pool": pool(m)} for m in metas]


def scores_csv(mean: dict[str, float]) -> str:
    """metric,score rows for the per-tag bar chart (a DVC plot): GenEval tags, T2I
    categories, then the overall / mean scores."""
    keys = sorted(mean, key=lambda k: (k.endswith(("overall", "/mean")), k))
    return "metric,score\n" + "".join(f"{k.removeprefix('eval/')},{mean[k]:.6g}\n" for k in keys)


@proc.flow("evaluate")
def evaluate(target: str) -> None:
    from margrpo.jsonl import read_jsonl

    params = common.load()
    if target != "base":
        params.method(target)  # a clear error for a target that is not a method
    study = run_id = None
    if proc.is_rank0():
        study = proc.open_study(params)
        run_id = study.child("evaluate", target)
        trained = common.REPORTS / "train" / target / "trained.json"
        if trained.exists():  # link the evaluation to the training runs it scores
            study.set_tags(run_id, {"trained_by": json.loads(trained.read_text())["mlflow_method_run"]})
        check_models(params, target)
    models_checked()
    metas = read_jsonl(common.TEST_PROMPTS)
    per_seed, per_seed_best, grid = {}, {}, None
    prompts = {"final": {}, "best": {}}   # seed -> per-prompt scores (the report's intervals)
    sampled = len(params.train.seeds)  # replicates sampled and scored; a best that is the final is not resampled
    t0 = time.time()
    for replicate, seed in enumerate(params.train.seeds):
        per_seed[seed], prompts["final"][str(seed)], picture = replicate_scores(
            params, common.model_for(target, seed, params), metas, replicate, f"evaluate {target} seed {seed}",
            grid=replicate == 0)
        grid = grid or picture  # replicate 0's
        if study is not None:
            study.log_metrics(run_id, {f"seed{seed}/{k}": v for k, v in per_seed[seed].items()})
        if target != "base":  # the checkpoint with the best held-out score during training
            if best_is_final(params, target, seed):  # selected at the last step: the same scores
                per_seed_best[seed], prompts["best"][str(seed)] = per_seed[seed], prompts["final"][str(seed)]
            else:
                per_seed_best[seed], prompts["best"][str(seed)], _ = replicate_scores(
                    params, common.model_for(target, seed, params, "best"), metas, replicate,
                    f"evaluate {target} seed {seed} (best)", grid=False)
                sampled += 1
            if study is not None:
                study.log_metrics(run_id, {f"seed{seed}/best/{k}": v for k, v in per_seed_best[seed].items()})
    if study is not None:
        from margrpo.world.generate import allocate_images

        allocation = allocate_images(metas, params.evaluate.images_per_prompt, params.evaluate.images_per_tag)
        publish(study, run_id, target, params, metas, per_seed, per_seed_best, prompts, grid, allocation,
                sum(allocation) * sampled, time.time() - t0)


def publish(study, run_id: str, target: str, params, metas: list[dict], per_seed: dict, per_seed_best: dict,
            prompts: dict, grid, allocation: list[int], images: int, seconds: float) -> None:
    """Rank 0: the target's files under reports/eval/<target>/ and its MLflow run."""
    from margrpo.stats import aggregate

    out = common.REPORTS / "eval" / target
    agg = aggregate(list(per_seed.values()))
    metrics = {"mean": agg["mean"], "std": agg["std"], "replicates": len(per_seed),
               # images sampled and scored, the best checkpoints' included (eval_s covers both)
               "images": images, "time/eval_s": round(seconds, 1)}
    if per_seed_best:
        best = aggregate(list(per_seed_best.values()))
        metrics["best"] = {"mean": best["mean"], "std": best["std"]}
    # Written only now, each file whole: a kill leaves the committed files as they were.
    common.save_png(grid, out / "grid.png")
    common.write_text(scores_csv(agg["mean"]), out / "scores.csv")
    common.write_json({str(k): v for k, v in per_seed.items()}, out / "per_seed.json")
    common.write_json({str(k): v for k, v in per_seed_best.items()}, out / "per_seed_best.json")
    common.write_json({"images_per_prompt": params.evaluate.images_per_prompt, "images": allocation,
                       "prompts": prompt_rows(metas), **prompts}, out / "per_prompt.json")
    common.write_json(metrics, out / "metrics.json")
    # 4 decimals (far below the replicate noise): readable in the runs table's columns
    study.log_metrics(run_id, agg["mean"], digits=4)
    study.log_metrics(run_id, {f"{k}_std": v for k, v in agg["std"].items()}, digits=4)
    study.log_artifact(run_id, out, "eval")
    study.finish(run_id)
    print(f"evaluate {target}: geneval overall {agg['mean'].get('eval/geneval/overall', float('nan')):.3f}, "
          f"t2i mean {agg['mean'].get('eval/t2i/mean', float('nan')):.3f}")


def check_models(params, target: str) -> None:
    """Every model this evaluation reads exists, before any sampling (a fresh clone has no
    trained models: they are DVC-cached and the repo has no remote)."""
    for seed in params.train.seeds:
        for which in ("final",) if target == "base" else ("final", "best"):
            path = common.model_for(target, seed, params, which)
            if not path.exists():
                raise FileNotFoundError(f"{path}: no such folder\n    fix: `dvc repro train@{target}` trains it "
                                        "(or `dvc repro` for the whole study)" if target != "base" else
                                        f"{path}: no such folder\n    fix: `git checkout -- {path}` restores the "
                                        "committed base model")


def best_is_final(params, target: str, seed: int) -> bool:
    """best/ holds the final weights (the held-out score peaked at the last step): every file
    of final/ is in best/ byte for byte, so its test scores are the final's (same image
    seeds) and are not sampled again. Every rank decides alike (the same files)."""
    final, best = (common.model_for(target, seed, params, which) for which in ("final", "best"))
    files = [p.relative_to(final) for p in final.rglob("*") if p.is_file()]
    return bool(files) and all((best / f).is_file() and (best / f).read_bytes() == (final / f).read_bytes()
                               for f in files)


def models_checked() -> None:
    """All ranks meet here after rank 0 has checked the models (no-op in one process). If
    rank 0's check fails it never arrives, and torchrun stops the waiting ranks: the error
    is reported once, by rank 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


if __name__ == "__main__":
    proc.main("evaluate", evaluate, key=("target", TARGET_HELP), doc=__doc__, ranks=True)

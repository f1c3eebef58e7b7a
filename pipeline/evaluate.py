"""Stage evaluate@<target>: score base / a trained method on the held-out world prompts.

`python -m pipeline.evaluate --target grpo`. One replicate per seed in train.seeds: for a
trained method, replicate s uses the model trained with seed s; for `base`, the one base
model. Replicate s samples evaluate.images_per_prompt images per prompt with the same
per-image seeds for every target, so targets differ only in their weights. Outputs under
reports/eval/<target>/: metrics.json (mean and std over replicates; DVC metrics),
per_seed.json (each replicate's summary, for the report's error bars) and grid.png
(replicate 0, evaluate.grid_prompts prompts across tags; a DVC image plot).
"""
from pipeline.common import preamble

preamble()

import argparse  # noqa: E402
import time  # noqa: E402

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402


@task(cache_policy=NO_CACHE)
def sample(params, model_path, metas: list[dict], replicate: int, desc: str):
    from margrpo.eval.generate import image_seeds, sample_images
    from margrpo.models.loading import load_model

    model = load_model(model_path, params)
    e = params.evaluate
    seeds = image_seeds(e.seed, replicate, len(metas), e.images_per_prompt)
    return sample_images(model, [m["prompt"] for m in metas], seeds, e.batch_size, desc=desc)


@task(cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def score(images, metas: list[dict], image_size: int) -> dict[str, float]:
    """Retried: scoring is the step that talks to reward / detector backends."""
    from margrpo.eval.generate import score_images, summarize
    from margrpo.world.evaluator import WorldEvaluator

    return summarize(score_images(WorldEvaluator(image_size), images, metas))


@flow(name="evaluate")
def evaluate(target: str) -> None:
    from margrpo.eval.generate import aggregate, prompt_grid
    from margrpo.world.prompts import read_jsonl

    params = common.load()
    if target != "base":
        params.method(target)  # a clear error for a target that is not a method
    study = common.open_study(params)
    run_id = study.child("evaluate", target)
    metas = read_jsonl(common.HELDOUT_PROMPTS)
    out = common.REPORTS / "eval" / target
    out.mkdir(parents=True, exist_ok=True)
    per_seed = {}
    t0 = time.time()
    for replicate, seed in enumerate(params.train.seeds):
        images = sample(params, common.model_for(target, seed, params), metas, replicate,
                        desc=f"evaluate {target} seed {seed}")
        per_seed[seed] = score(images, metas, params.world.image_size)
        study.log_metrics(run_id, {f"seed{seed}/{k}": v for k, v in per_seed[seed].items()})
        if replicate == 0:
            prompt_grid(images, metas, params.evaluate.grid_prompts).save(out / "grid.png")
    agg = aggregate(list(per_seed.values()))
    metrics = {"mean": agg["mean"], "std": agg["std"], "replicates": len(per_seed),
               "images": len(metas) * params.evaluate.images_per_prompt * len(per_seed),
               "time/eval_s": round(time.time() - t0, 1)}
    common.write_json(metrics, out / "metrics.json")
    common.write_json({str(k): v for k, v in per_seed.items()}, out / "per_seed.json")
    study.log_metrics(run_id, agg["mean"])
    study.log_metrics(run_id, {f"{k}_std": v for k, v in agg["std"].items()})
    study.log_artifact(run_id, out, "eval")
    study.finish(run_id)
    print(f"evaluate {target}: geneval overall {agg['mean'].get('eval/geneval/overall', float('nan')):.3f}, "
          f"t2i mean {agg['mean'].get('eval/t2i/mean', float('nan')):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="base or a key of params.yaml `methods`")
    evaluate(parser.parse_args().target)


if __name__ == "__main__":
    main()

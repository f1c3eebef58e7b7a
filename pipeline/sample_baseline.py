"""Stage sample_baseline: what GRPO starts from, before any training time is spent.

Samples the base model on a slice of the training prompts in GRPO-sized groups (train.
group_size images per prompt) and scores them with the training reward. Reports the reward
level and, per prompt, the group spread: a group with zero spread gives zero advantage, so
`baseline/zero_std_group_frac` near 1 means the reward gives GRPO nothing to learn from.
Writes reports/baseline/metrics.json and reports/baseline/grid.png.
"""
from __future__ import annotations

from pipeline import common, proc

OUT = common.REPORTS / "baseline"
# Prompts per GenEval tag / T2I category: enough to see the reward's level, cheap to sample.
PROMPTS_PER_PURPOSE = 2


@proc.task(retries=2, retry_delay_seconds=5)
def score_rewards(specs: list[dict], images, metas: list[dict]):
    """Rewards [P, G]. Retried: a remote reward backend can fail transiently."""
    from margrpo.rewards.base import build_weighted_reward

    reward = build_weighted_reward(specs)
    p, g = images.shape[:2]
    flat = [m for m in metas for _ in range(g)]
    return reward(images.reshape(p * g, *images.shape[2:]), [m["prompt"] for m in flat], flat).reshape(p, g)


def pick_prompts(rows: list[dict], per_purpose: int) -> list[dict]:
    seen: dict[str, int] = {}
    out = []
    for row in rows:
        purpose = row.get("tag") or row.get("category")
        if seen.get(purpose, 0) < per_purpose:
            seen[purpose] = seen.get(purpose, 0) + 1
            out.append(row)
    return out


@proc.flow("sample_baseline")
def sample_baseline() -> None:
    from margrpo.jsonl import read_jsonl
    from margrpo.models.loading import load_model
    from margrpo.world.generate import image_seeds, prompt_grid, sample_images

    params = common.load()
    study = proc.open_study(params)
    run_id = study.child("sample_baseline", "base")
    metas = pick_prompts(read_jsonl(common.TRAIN_PROMPTS), PROMPTS_PER_PURPOSE)
    group = params.train.group_size
    model = load_model(params.model.checkpoint, params)
    seeds = image_seeds(params.evaluate.seed, 0, len(metas), group)
    images = sample_images(model, [m["prompt"] for m in metas], seeds, params.evaluate.batch_size,
                           desc="baseline samples")
    rewards = score_rewards(params.reward_specs(), images, metas)
    group_std = rewards.std(dim=1)
    metrics = {
        "baseline/reward_mean": float(rewards.mean()),
        "baseline/reward_std": float(rewards.std()),
        "baseline/group_std_mean": float(group_std.mean()),
        "baseline/zero_std_group_frac": float((group_std < 1e-6).float().mean()),
        "baseline/prompts": len(metas),
        "baseline/group_size": group,
    }
    common.save_png(prompt_grid(images, metas, params.evaluate.grid_prompts), OUT / "grid.png")
    common.write_json(metrics, OUT / "metrics.json")
    study.log_metrics(run_id, metrics)
    study.log_artifact(run_id, OUT, "baseline")
    study.finish(run_id)
    print("baseline:", ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()))


if __name__ == "__main__":
    proc.main("sample_baseline", sample_baseline)

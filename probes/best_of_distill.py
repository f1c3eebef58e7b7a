"""Can the model hold what RL is asked to find? One round of best-of-N distillation.

    .venv/bin/python probes/best_of_distill.py --batches 32 --group 16 --steps 200 \
        --save outputs/distill/model --pool outputs/distill/pool.pt [--init models/base] [--seed 11]
    .venv/bin/python probes/reward_transfer.py --batches 4 --models models/base outputs/distill/model

The model samples --batches training batches of 16 prompts x --group images (the trainer's
own prompt and noise draws at --seed; the default differs from reward_transfer's seed 7, so
the images scored there are not the ones kept here), scores them by the study's world reward,
and keeps the best image of each prompt group. It is then trained on those (prompt, image)
pairs with its own pretraining loss (margrpo.models.pretrain, the pretrain section's settings
except the schedule below) and saved as the base is. In docs/learning.md this separates two
reasons for rung b's plateau: if the distilled model's reward rises well past what GRPO
reaches, the model can hold a better policy and the estimator does not find it; if it stops
at the same place, the model's capacity is the ceiling.

Prints the pool's reward (every image, and the kept best of each group) and the saved path.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.models.loading import configure, load_model, save_base
from margrpo.models.pretrain import pretrain
from margrpo.probes.samples import ScoredSamples
from margrpo.stats import mean_std
from margrpo.training.trainer import Trainer


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--init", default="models/base", help="model folder to sample from and train")
    ap.add_argument("--batches", type=int, default=32, help="training batches of 16 prompts to sample")
    ap.add_argument("--group", type=int, default=16, help="images per prompt; the best of them is kept")
    ap.add_argument("--steps", type=int, default=200, help="training steps on the kept images")
    ap.add_argument("--seed", type=int, default=11, help="the trainer seed whose batches are sampled")
    ap.add_argument("--save", required=True, help="folder for the trained model (saved as the base is)")
    ap.add_argument("--pool", type=Path, help="file of the kept images: written after sampling, read instead of "
                    "sampling when it exists (to rerun the training with other pretrain.* settings)")
    a = ap.parse_args()
    params = params_from_args(a, before=["pretrain.lr=3e-4", "pretrain.warmup_steps=20",
                                         f"pretrain.decay_steps={a.steps // 2}", "pretrain.seed=11"],
                              fixed={"train.group_size": a.group, "pretrain.steps": a.steps})
    pool = ScoredSamples(params, keep_best=a.group)
    if a.pool and a.pool.exists():
        saved = torch.load(a.pool)
        pool.best_images, pool.best_prompts, pool.best_rewards = list(saved["images"]), saved["prompts"], saved["rewards"]
        print(f"pool: {len(pool.best_prompts)} kept images read from {a.pool} ({saved['made_by']})", flush=True)
    else:
        tr = Trainer.from_params(params, "grpo_frozen", a.seed, read_jsonl("prompts/world_train.jsonl"),
                                 reward=pool, checkpoint=a.init)
        with torch.no_grad():
            for _ in range(a.batches):
                tr.collect()
        every = [r["aligned"] for r in pool.rows]
        m_kept, sd_kept, n_kept = mean_std(pool.best_rewards)
        print(f"pool: {len(every)} images, world reward {sum(every) / len(every):.3f}; kept the best of each "
              f"group of {a.group}: {n_kept} images, {m_kept:.3f} (sd {sd_kept:.3f})", flush=True)
        if a.pool:
            a.pool.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"images": torch.stack(pool.best_images), "prompts": pool.best_prompts,
                        "rewards": pool.best_rewards, "made_by": f"{a.init} seed {a.seed} {a.batches}x{params.train.prompts_per_step}x{a.group}"},
                       a.pool)
    torch.manual_seed(params.pretrain.seed)
    model = load_model(a.init, params).requires_grad_(True)
    ema = pretrain(model, params.pretrain, pool)
    out = copy.deepcopy(ema)
    configure(out, params.sampling)
    save_base(out, a.save)
    print(f"saved {a.save} after {a.steps} steps on the kept images", flush=True)


if __name__ == "__main__":
    main()

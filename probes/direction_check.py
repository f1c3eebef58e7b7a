"""Does one batch's policy gradient raise the expected reward? A direct test of the
learning signal on the real base and reward, free of optimizer and learning-rate choices.

    .venv/bin/python probes/direction_check.py --method grpo --batches 4 -S methods.grpo.freeze_head=true

For each of --batches training batches (drawn like a training step: prompts_per_step x
group_size rollouts, rewards, group advantages, the method's loss plan; with --accumulate N,
the sum of N such batches' gradients) it computes the loss gradient and moves the weights by a step of fixed size along -grad and along +grad, then
scores --eval-prompts training prompts x --eval-images images with fixed image seeds
(common random numbers: the same seeds at every point, so the difference reflects the
weights, not the draw). The central difference (R(-) - R(+)) / 2 is the reward gain of
following that batch's gradient; it is positive on average iff the gradient carries signal.
"sign" steps move every weight by --sign-lr x sign(grad), the shape of Adam's first update.
"""
from __future__ import annotations

import statistics

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.training.trainer import Trainer


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--method", default="mar_grpo")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--accumulate", type=int, default=1, help="training batches summed into each gradient")
    ap.add_argument("--eval-prompts", type=int, default=64)
    ap.add_argument("--eval-images", type=int, default=4)
    ap.add_argument("--norm-step", type=float, default=1.0, help="L2 size of the raw-gradient step")
    ap.add_argument("--sign-lr", type=float, default=5e-4, help="per-weight size of the sign step")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    params = params_from_args(a)
    train = read_jsonl("prompts/world_train.jsonl")
    tr = Trainer.from_params(params, a.method, a.seed, train)
    policy, reward = tr.policy, tr.reward

    pick = torch.randperm(len(train), generator=torch.Generator().manual_seed(10**6 + a.seed))[: a.eval_prompts]
    metas = [train[i] for i in pick.tolist() for _ in range(a.eval_images)]
    seeds = torch.arange(len(metas)) + 10**9

    def expected_reward() -> float:
        policy.eval()
        out = []
        for s in range(0, len(metas), 64):
            ro = policy.rollout([m["prompt"] for m in metas[s : s + 64]], seeds=seeds[s : s + 64])
            out.append(reward(ro.images, ro.prompts, metas[s : s + 64]).float())
        return torch.cat(out).mean().item()

    r0 = expected_reward()
    print(f"reward at the base on {len(metas)} fixed-seed images: {r0:.4f}", flush=True)
    gains: dict[str, list[float]] = {"norm": [], "sign": []}
    trained = [p for group in tr.opt.param_groups for p in group["params"]]
    for b in range(a.batches):
        grads, batch_rewards = [torch.zeros_like(p) for p in trained], []
        for _ in range(a.accumulate):
            batch = tr.collect()
            tr.compute_grads(batch)
            batch_rewards.append(batch.rewards)
            for g, p in zip(grads, trained):
                if p.grad is not None:
                    g += p.grad
        rewards = torch.cat(batch_rewards)
        start = [p.detach().clone() for p in trained]
        gnorm = torch.sqrt(sum((g**2).sum() for g in grads))
        steps = {"norm": [g * (a.norm_step / gnorm) for g in grads], "sign": [g.sign() * a.sign_lr for g in grads]}
        row = []
        for kind, delta in steps.items():
            moved = {}
            for sign in (-1.0, 1.0):
                with torch.no_grad():
                    for p, p0, d in zip(trained, start, delta):
                        p.copy_(p0 + sign * d)
                moved[sign] = expected_reward()
            gains[kind].append((moved[-1.0] - moved[1.0]) / 2)
            row.append(f"{kind} {gains[kind][-1]:+.4f} (down {moved[-1.0] - r0:+.4f}, up {moved[1.0] - r0:+.4f})")
        with torch.no_grad():
            for p, p0 in zip(trained, start):
                p.copy_(p0)
        print(f"batch {b}: batch reward {rewards.mean():.3f} +- {rewards.std():.3f}; gain along -grad: "
              + "; ".join(row), flush=True)
    for kind, v in gains.items():
        sd = statistics.stdev(v) if len(v) > 1 else float("nan")
        print(f"{kind}: mean gain {statistics.mean(v):+.4f} +- {sd / len(v) ** 0.5:.4f} (se), "
              f"positive in {sum(x > 0 for x in v)}/{len(v)} batches")


if __name__ == "__main__":
    main()

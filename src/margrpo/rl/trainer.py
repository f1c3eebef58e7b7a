"""GRPO / MAR-GRPO training loop: rollout -> reward -> advantages -> loss -> AdamW.

Vanilla GRPO and MAR-GRPO run the same code; the method config decides the head freeze,
the estimator and the token selection. Every random draw comes from one of four
torch.Generators (prompt order, rollout seeds, loss-step subsets, MTE draws) whose states
are checkpointed, so a killed run resumed from its last checkpoint ends with the same
weights as an uninterrupted one.

Batch arithmetic per step: prompts_per_step prompts x group_size images = B rollouts; the
loss covers loss_ar_steps random AR steps x loss_head_steps random head transitions.
"""
from __future__ import annotations

import copy
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from tqdm.auto import tqdm

from margrpo.config import Params, ResolvedMethod
from margrpo.models.loading import load_model
from margrpo.models.protocol import MARPolicy
from margrpo.rewards.base import build_weighted_reward
from margrpo.rl.advantages import group_advantages, zero_std_fraction
from margrpo.rl.gradprobe import flat_grad, pair_stats, variance_ratio
from margrpo.rl.policy_loss import loss_backward, prepare, speculative_steps_needed

GENERATORS = ("data", "rollout", "plan", "mte")


class Batch(NamedTuple):
    """One training batch: rollout, rewards, advantages and loss plan (Trainer.collect)."""

    groups: torch.Tensor  # [B] group index of every image
    ar_steps: list[int]
    head_steps: list[torch.Tensor]
    rollout: object
    rewards: torch.Tensor  # [B]
    adv: torch.Tensor  # [B]
    plans: list
    rollout_s: float


class NonFiniteError(RuntimeError):
    pass


def lr_lambda(tcfg) -> Callable[[int], float]:
    def f(step: int) -> float:
        warm = min(1.0, (step + 1) / tcfg.warmup_steps) if tcfg.warmup_steps else 1.0
        frac = step / max(1, tcfg.steps)
        if tcfg.lr_schedule == "cosine":
            return warm * 0.5 * (1 + math.cos(math.pi * frac))
        if tcfg.lr_schedule == "linear":
            return warm * (1 - frac)
        return warm

    return f


def grad_norm(params: list[torch.nn.Parameter]) -> float:
    gs = [p.grad for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in gs]))) if gs else 0.0


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class Trainer:
    def __init__(self, policy, params: Params, method: ResolvedMethod, seed: int, prompts: list[dict], reward):
        self.policy, self.params, self.method, self.tcfg = policy, params, method, params.train
        self.prompts, self.reward, self.seed = prompts, reward, seed
        self.ref = copy.deepcopy(policy).eval().requires_grad_(False) if self.tcfg.beta_kl > 0 else None
        self.ar_params = list(policy.ar_parameters())
        self.head_params = list(policy.head_parameters())
        for p in self.head_params:
            p.requires_grad_(not method.freeze_head)
        trainable = self.ar_params + ([] if method.freeze_head else self.head_params)
        t = self.tcfg
        self.opt = torch.optim.AdamW(trainable, lr=method.lr or t.lr, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t))
        self.gens = {name: torch.Generator().manual_seed(seed * 1000 + k) for k, name in enumerate(GENERATORS)}
        self.step = 0
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0

    # ---- checkpoints ----------------------------------------------------------------
    def state(self) -> dict:
        return {
            "step": self.step,
            "policy": self.policy.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "generators": {k: g.get_state() for k, g in self.gens.items()},
            "nonfinite": (self.nonfinite_in_row, self.nonfinite_total),
        }

    def load_state(self, s: dict) -> None:
        self.step = s["step"]
        self.policy.load_state_dict(s["policy"])
        self.opt.load_state_dict(s["optimizer"])
        self.sched.load_state_dict(s["scheduler"])
        for k, g in self.gens.items():
            g.set_state(s["generators"][k])
        self.nonfinite_in_row, self.nonfinite_total = s["nonfinite"]

    # ---- one step -------------------------------------------------------------------
    def sample_batch(self) -> tuple[list[dict], torch.Tensor]:
        t = self.tcfg
        pick = torch.randint(len(self.prompts), (t.prompts_per_step,), generator=self.gens["data"]).tolist()
        metas = [self.prompts[i] for i in pick for _ in range(t.group_size)]
        groups = torch.arange(t.prompts_per_step).repeat_interleave(t.group_size)
        return metas, groups

    def plan_steps(self) -> tuple[list[int], list[torch.Tensor]]:
        k_ar, t_head = self.policy.num_ar_steps, self.policy.sampler.num_steps
        # Head transitions eligible for the loss: the first loss_head_window (noisiest) ones.
        # The score of a late, low-noise transition scales like 1/std and carries little of
        # the reward (colour and shape are decided early), so it mostly adds variance.
        t_head = min(t_head, self.tcfg.loss_head_window or t_head)
        g = self.gens["plan"]
        ar = sorted(torch.randperm(k_ar, generator=g)[: self.tcfg.loss_ar_steps].tolist())
        heads = [torch.randperm(t_head, generator=g)[: self.tcfg.loss_head_steps].sort().values for _ in ar]
        return ar, heads

    def compute_grads(self, rollout, plans, adv, image_weight=None) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        return loss_backward(self.policy, self.ref, rollout, plans, adv, self.tcfg, image_weight)

    def collect(self) -> Batch:
        """One batch's rollout, rewards, advantages and loss plan, drawn from the trainer's
        generators."""
        t0 = time.time()
        metas, groups = self.sample_batch()
        ar_steps, head_steps = self.plan_steps()
        spec = speculative_steps_needed(self.method, ar_steps)
        self.policy.eval()
        rollout = self.policy.rollout([m["prompt"] for m in metas], generator=self.gens["rollout"], speculative_steps=spec)
        t_roll = time.time() - t0
        rewards = self.reward(rollout.images, rollout.prompts, metas).float()
        adv = group_advantages(rewards, groups)
        plans = prepare(self.policy, rollout, ar_steps, head_steps, self.method, self.tcfg.cfg_mode, self.gens["mte"])
        return Batch(groups, ar_steps, head_steps, rollout, rewards, adv, plans, t_roll)

    def train_step(self) -> dict[str, float]:
        t0 = time.time()
        groups, ar_steps, head_steps, rollout, rewards, adv, plans, t_roll = self.collect()
        m: dict[str, float] = {
            "reward/mean": rewards.mean().item(),
            "reward/std": rewards.std().item(),
            "reward/min": rewards.min().item(),
            "reward/max": rewards.max().item(),
            "adv/zero_std_frac": float(zero_std_fraction(rewards, groups)),
            "time/rollout": t_roll,
        }
        for key in ("select/topk_frac", "select/consistency_frac", "select/ess", "diag/uncertainty_mean"):
            vals = [p.stats[key] for p in plans if key in p.stats]
            if vals:
                m[key] = sum(vals) / len(vals)
        probe_due = self.tcfg.grad_probe_every and self.step % self.tcfg.grad_probe_every == 0
        if probe_due:
            m.update(self.grad_probe(rollout, ar_steps, head_steps, adv, groups, plans))
        skipped = 0.0
        for _ in range(self.tcfg.inner_epochs):
            stats = self.compute_grads(rollout, plans, adv)
            g_ar, g_head = grad_norm(self.ar_params), grad_norm(self.head_params)
            finite = all(math.isfinite(v) for v in (stats["loss/policy"], stats["loss/kl"], g_ar, g_head))
            if not finite:
                skipped = 1.0
                self.opt.zero_grad(set_to_none=True)
                break
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]], self.tcfg.grad_clip)
            self.opt.step()
        self.sched.step()
        self.step += 1
        if skipped:
            self.nonfinite_in_row += 1
            self.nonfinite_total += 1
        else:
            self.nonfinite_in_row = 0
        m.update(stats)
        m.update({
            "diag/grad_norm_ar": g_ar,
            "diag/grad_norm_head": g_head,
            "diag/lr": self.sched.get_last_lr()[0],
            "diag/nonfinite_skipped": float(self.nonfinite_total),
            "time/step": time.time() - t0,
        })
        self.last_rollout, self.last_plans = rollout, plans
        return m

    def grad_probe(self, rollout, ar_steps, head_steps, adv, groups, plans) -> dict[str, float]:
        """Gradient-variance probe (method.md §6 claim 3) on this rollout, before the update.

        - probe/cos_draws: cosine of two AR gradients from independent MTE draws.
        - probe/cos_halves: cosine of the gradients from the two halves of every group.
        - probe/var_ratio_vs_single: noise variance |g_a - g_b|^2 / 2 over group halves for
          this method divided by the same for the `single` estimator (< 1: less variance).
        """
        cfg_mode = self.tcfg.cfg_mode
        half = (torch.arange(len(groups)) % self.tcfg.group_size) < self.tcfg.group_size // 2

        def grad_of(plans_, weight=None):
            self.compute_grads(rollout, plans_, adv, weight)
            return flat_grad([p.grad for p in self.ar_params], self.ar_params)

        out: dict[str, float] = {}
        g1 = grad_of(plans)
        if self.method.estimator != "single":
            probe_gen = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=self.gens["mte"])))
            alt = prepare(self.policy, rollout, ar_steps, head_steps, self.method, cfg_mode, probe_gen)
            out["probe/cos_draws"] = pair_stats(g1, grad_of(alt))["cosine"]
        halves = pair_stats(grad_of(plans, half), grad_of(plans, ~half))
        out["probe/cos_halves"] = halves["cosine"]
        out["probe/noise_var"] = halves["noise_var"]
        single = self.method.model_copy(update={"estimator": "single", "topk": False})
        sp = prepare(self.policy, rollout, ar_steps, head_steps, single, cfg_mode, torch.Generator().manual_seed(0))
        ref_stats = pair_stats(grad_of(sp, half), grad_of(sp, ~half))
        out["probe/var_ratio_vs_single"] = variance_ratio(halves, ref_stats)
        self.opt.zero_grad(set_to_none=True)
        return out


def train(
    params: Params,
    method: str,
    seed: int,
    out_dir: Path,
    *,
    base_checkpoint: Path,
    train_prompts: list[dict],
    log: Callable[[int, dict[str, float]], None] | None = None,
    progress: bool = True,
) -> Path:
    """Train one (method, seed); resumes from out_dir/ckpt.pt. Returns out_dir/final."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resolved = params.method(method)
    torch.manual_seed(seed)
    policy: MARPolicy = load_model(base_checkpoint, params)
    reward = build_weighted_reward(params.reward_specs())
    tr = Trainer(policy, params, resolved, seed, train_prompts, reward)
    ckpt, hist_path = out_dir / "ckpt.pt", out_dir / "history.jsonl"
    if ckpt.exists():
        tr.load_state(torch.load(ckpt, weights_only=False))
        # Drop history lines written after the checkpoint (the killed tail is redone).
        if hist_path.exists():
            lines = [l for l in hist_path.read_text().splitlines() if l and json.loads(l)["step"] <= tr.step]
            hist_path.write_text("".join(l + "\n" for l in lines))
    elif hist_path.exists():
        hist_path.unlink()
    t = params.train
    bar = tqdm(total=t.steps, initial=tr.step, desc=f"train {method} seed {seed}", disable=not progress)
    with open(hist_path, "a") as hist:
        while tr.step < t.steps:
            metrics = tr.train_step()
            if tr.nonfinite_in_row >= t.max_nonfinite_in_row:
                raise NonFiniteError(
                    f"{tr.nonfinite_in_row} steps in a row had a non-finite loss or gradient (step {tr.step}); "
                    f"the last good checkpoint is {ckpt}. Lower train.lr or raise train.grad_clip."
                )
            hist.write(json.dumps({"step": tr.step, **metrics}) + "\n")
            hist.flush()
            if log is not None:
                log(tr.step, metrics)
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
            if tr.step % t.checkpoint_every == 0 or tr.step == t.steps:
                _atomic_save(tr.state(), ckpt)
    bar.close()
    if getattr(tr, "last_plans", None) is not None:
        _save_selection_examples(tr, out_dir / "selection_examples.pt")
    final = out_dir / "final"
    policy.save_pretrained(final)
    return final


def _save_selection_examples(tr: Trainer, path: Path, n_images: int = 4) -> None:
    """Uncertainty / selection maps of the last rollout for the report (a few images)."""
    ro, plans = tr.last_rollout, tr.last_plans
    n_tok = ro.tokens.shape[1]
    ex = {"images": ro.images[:n_images], "prompts": ro.prompts[:n_images], "steps": []}
    for p in plans:
        loss_map = torch.zeros(ro.batch_size, n_tok)
        loss_map.scatter_(1, p.positions, p.mask.float())
        sel_map = torch.zeros(ro.batch_size * p.positions.shape[1])
        if p.draw is not None and p.draw.rows.numel():
            sel_map[p.draw.rows] = 1.0
        sel = torch.zeros(ro.batch_size, n_tok).scatter_(1, p.positions, sel_map.view(ro.batch_size, -1))
        ex["steps"].append({"ar_step": p.index, "loss_tokens": loss_map[:n_images], "selected": sel[:n_images]})
    torch.save(ex, path)

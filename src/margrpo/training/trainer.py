"""GRPO / MAR-GRPO training, data first: `Trainer.collect` returns a complete `Batch`
(prompts, rollout with its images, rewards, group advantages, and the token plan with its
chains and old log-probs); `Trainer.update(batch)` scores every term the loss needs
(`score_step`: the rollout chains, the multi-trajectory chains, the reference model), turns
them into the loss with method/losses.py `step_loss`, and steps the optimiser. The loop
(training/loop.py `train_step`) calls collect, then what only reads the batch (its
metrics, the gradient probe when due), then update.

Vanilla GRPO and MAR-GRPO run the same code; the resolved method (Params.method and
Params.train_for) decides the head freeze, the estimator, the token scope, the selection
and the per-method training settings. Every random draw comes from one of three
torch.Generators (prompt order, image seeds, loss-step subsets) whose states are
checkpointed, or is keyed by an image seed (the rollout's noise and the multi-trajectory
chains, models/noise.py), so a killed run resumed from its last checkpoint ends with the
same weights as an uninterrupted one.

Data parallel (ranks/distributed.py): every rank draws the same global batch and token plan
from the shared generators and rolls out its block of whole groups; the loss is
normalised by the global image count and the gradients are summed over ranks, so N
processes step like one process with the same global batch. Tensors live on the policy's
device; the reward sees CPU images.

Batch arithmetic per step: prompts_per_step prompts x group_size images = B rollouts; the
loss covers loss_ar_steps AR steps (all of them by default) x loss_head_steps head
transitions drawn from the loss_head_window noisiest ones, every token committed at those
steps (plus filtered speculative tokens for the committed+speculative scope). A top-k
method's uncertainty chains are drawn by the rollout (method/plan.py), and the M chains of a
token share one head call per step in the loss (models/chains.py shared_guided_output).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from typing import Callable, NamedTuple

import torch

from margrpo.config import Params, ResolvedMethod
from margrpo.hostsync import read_all
from margrpo.method.advantages import group_advantages
from margrpo.method.losses import StepScores, step_loss
from margrpo.method.plan import TokenPlan, plan_tokens, speculative_steps_needed, uncertainty_chains_needed
from margrpo.models.chains import ChainScorer, gather_rows
from margrpo.models.noise import draw_seeds
from margrpo.models.protocol import MARPolicy, Rollout
from margrpo.ranks.distributed import World, check_shardable, current

GENERATORS = ("data", "rollout", "plan")


# The gradient norms a step reports (diag/*), of the summed gradient.
NORM_KEYS = ("diag/grad_norm_ar", "diag/grad_norm_head")


class NonFiniteError(RuntimeError):
    """Training stopped: the weights went non-finite, or too many steps in a row had a
    non-finite loss or gradient (Trainer.update)."""


class Batch(NamedTuple):
    """One training batch, complete (Trainer.collect): everything the update and the
    diagnostics read. On a rank of a data-parallel run, its block of the global batch (B
    images of whole groups)."""

    groups: torch.Tensor  # [B] global group index of every image
    rollout: Rollout  # prompts, image seeds, images [B, 3, H, W], every AR step's chains
    rewards: torch.Tensor  # [B]
    adv: torch.Tensor  # [B] group advantages
    plans: list[TokenPlan]  # one per loss AR step: loss tokens, chains, old log-probs
    rollout_s: float  # seconds of rollout
    # [B] the base model's rewards on the same prompts and image seeds (methods.<m>.paired_base)
    base_rewards: torch.Tensor | None = None
    # metric name -> [B] per-image values from the trainer's monitor (e.g. an evaluation judge)
    monitored: dict[str, torch.Tensor] | None = None


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


class Trainer:
    def __init__(self, policy: MARPolicy, params: Params, method: ResolvedMethod, seed: int,
                 prompts: list[dict], reward, world: World | None = None, monitor=None):
        """monitor: optional (CPU images [B, 3, H, W], metadata [B]) -> {metric: [B] values},
        logged as the batch mean beside the reward and never fed to the loss (the study
        passes the evaluation judge)."""
        self.policy, self.params, self.method, self.tcfg = policy, params, method, params.train_for(method.name)
        self.prompts, self.reward, self.seed, self.monitor = prompts, reward, seed, monitor
        by_purpose: dict[str, list[int]] = {}
        for i, m in enumerate(prompts):
            by_purpose.setdefault(m.get("tag") or m.get("category") or "", []).append(i)
        self.strata = [by_purpose[k] for k in sorted(by_purpose)]  # prompt indices per purpose
        self.world = world or current()
        check_shardable(self.tcfg.prompts_per_step, self.world.size)
        self.device = next(policy.parameters()).device
        self.world.broadcast_params(list(policy.parameters()))  # every rank starts from rank 0's weights
        self.ar_params = list(policy.ar_parameters())
        self.head_params = list(policy.head_parameters())
        for p in self.head_params:
            p.requires_grad_(not method.freeze_head)
        self.trained = self.ar_params + ([] if method.freeze_head else self.head_params)
        trained_ids = {id(p) for p in self.trained}
        self.trained_names = [n for n, p in policy.named_parameters() if id(p) in trained_ids]
        # The KL reference copies only the trained parameters; frozen ones (the head, a text
        # encoder, a VAE) are shared with the policy through the deepcopy memo.
        # It is also the base model that paired_base rolls out.
        self.ref = None
        if self.tcfg.beta_kl > 0 or method.paired_base:
            shared = {id(p): p for p in policy.parameters() if id(p) not in trained_ids}
            self.ref = copy.deepcopy(policy, dict(shared)).eval()
            for p in self.ref.parameters():
                if id(p) not in shared:
                    p.requires_grad_(False)
        t = self.tcfg
        self.opt = torch.optim.AdamW(self.trained, lr=t.lr, betas=tuple(t.adam_betas), weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(t))
        self.gens = {name: torch.Generator().manual_seed(seed * 1000 + k) for k, name in enumerate(GENERATORS)}
        self.step = 0
        self.nonfinite_in_row = 0
        self.nonfinite_total = 0
        self.best = {"step": -1, "score": -math.inf}  # best held-out score so far (training/loop.py)

    @classmethod
    def from_params(cls, params: Params, method: str, seed: int, prompts: list[dict], *,
                    policy: MARPolicy | None = None, reward=None, checkpoint: str | None = None,
                    monitor=None) -> "Trainer":
        """The one way the pipeline, scripts and tests build a trainer: the policy loaded
        from `checkpoint` (default model.checkpoint) unless given, the reward from
        params.rewards unless given, torch's global seed set to `seed` for anything
        outside the trainer's own generators."""
        from margrpo.models.loading import load_model
        from margrpo.rewards.base import build_weighted_reward

        resolved = params.method(method)
        torch.manual_seed(seed)
        policy = policy if policy is not None else load_model(checkpoint or params.model.checkpoint, params)
        reward = reward if reward is not None else build_weighted_reward(params.reward_specs())
        return cls(policy, params, resolved, seed, prompts, reward, monitor=monitor)

    # ---- checkpoints ----------------------------------------------------------------
    def state(self) -> dict:
        return {
            "step": self.step,
            # Only what training changes: a checkpoint of a 0.6 B model with a frozen text
            # encoder and VAE holds the transformer alone; copied to the host (not cloned on
            # the GPU, where a second copy of the weights may not fit).
            "policy": {n: p.detach().to("cpu", copy=True) for n, p in self.policy.named_parameters()
                       if n in self.trained_names},
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "generators": {k: g.get_state() for k, g in self.gens.items()},
            "nonfinite": (self.nonfinite_in_row, self.nonfinite_total),
            "best": dict(self.best),
        }

    def load_state(self, s: dict) -> None:
        self.step = s["step"]
        if sorted(s["policy"]) != sorted(self.trained_names):
            raise ValueError("this checkpoint was written for other trained parameters (another method or "
                             "model); delete it to restart the run")
        params = dict(self.policy.named_parameters())
        with torch.no_grad():
            for n, v in s["policy"].items():
                params[n].copy_(v)
        self.opt.load_state_dict(s["optimizer"])
        self.sched.load_state_dict(s["scheduler"])
        for k, g in self.gens.items():
            g.set_state(s["generators"][k])
        self.nonfinite_in_row, self.nonfinite_total = s["nonfinite"]
        self.best = dict(s["best"])

    # ---- the batch's draws ----------------------------------------------------------
    def sample_batch(self) -> tuple[list[dict], torch.Tensor]:
        """The global batch: prompt metadata [B] (each prompt group_size times) and group ids [B].

        Stratified by purpose (a prompt's GenEval tag, else its T2I-CompBench category; one
        stratum for prompts with neither): the strata are visited in a fresh random order
        each step, one uniformly drawn prompt each, cycling when prompts_per_step exceeds
        their number. Every batch then mixes the purposes alike, so the mean training
        reward of a step moves with the policy, not with which purposes the draw hit.
        """
        t, g = self.tcfg, self.gens["data"]
        order = torch.randperm(len(self.strata), generator=g).tolist()
        pick = []
        for k in range(t.prompts_per_step):
            stratum = self.strata[order[k % len(order)]]
            pick.append(stratum[int(torch.randint(len(stratum), (1,), generator=g))])
        metas = [self.prompts[i] for i in pick for _ in range(t.group_size)]
        groups = torch.arange(t.prompts_per_step, device=self.device).repeat_interleave(t.group_size)
        return metas, groups

    def plan_steps(self) -> tuple[list[int], list[torch.Tensor], tuple[int, ...] | None]:
        """AR steps in the loss (loss_ar_steps of them; all by default), per AR step the head
        transitions in the loss [S], and the rollout's SDE window (None: all stochastic).

        Without a window the head transitions are loss_head_steps drawn from the
        loss_head_window noisiest ones: the score of a late, low-noise transition scales like
        1/std and carries little of the reward (colour and shape are decided early), so it
        mostly adds variance. With train.sde_window = W the rollout draws only W consecutive
        transitions inside those (train.sde_window_mode places them) and the loss scores
        exactly those: the other transitions are deterministic and carry no score."""
        k_ar, t_head = self.policy.num_ar_steps, self.policy.sampler.num_steps
        span = min(t_head, self.tcfg.loss_head_window or t_head)
        n_ar = min(k_ar, self.tcfg.loss_ar_steps or k_ar)
        g = self.gens["plan"]
        ar = sorted(torch.randperm(k_ar, generator=g)[:n_ar].tolist())
        w = self.tcfg.sde_window
        if not w:
            heads = [torch.randperm(span, generator=g)[: self.tcfg.loss_head_steps].sort().values for _ in ar]
            return ar, heads, None
        start = self.window_start(span, w, g)
        window = tuple(range(start, start + w))
        return ar, [torch.tensor(window) for _ in ar], window

    def window_start(self, span: int, width: int, g: torch.Generator) -> int:
        """First transition of this step's SDE window of `width` among the `span` eligible ones."""
        mode = self.tcfg.sde_window_mode
        if mode == "fixed":
            return self.tcfg.sde_window_start
        if mode == "random":
            return int(torch.randint(span - width + 1, (1,), generator=g))
        return round((span - width) * self.step / max(1, self.tcfg.steps - 1))  # sliding, noisy -> clean

    # ---- the step: collect, then update ------------------------------------------------
    def scorer(self, rollout: Rollout, reference: bool = False) -> ChainScorer:
        """How the loss scores chains of this rollout: the policy (or the KL reference) at
        the rollout's guidance scale, in the loss's guidance mode (train.cfg_mode)."""
        return ChainScorer(self.ref if reference else self.policy, rollout.cfg_scale, self.tcfg.cfg_mode,
                           rollout.sde_steps)

    def collect(self) -> Batch:
        """Rollout -> reward -> group advantages -> token plan, at theta_old (no grad)."""
        t0 = time.time()
        metas, groups = self.sample_batch()
        seeds = draw_seeds(self.gens["rollout"], len(metas))  # [B global], the same on every rank
        ar_steps, head_steps, sde_steps = self.plan_steps()
        mine = self.world.shard(len(metas))  # whole groups (check_shardable)
        metas, groups = metas[mine], groups[mine]
        self.policy.eval()
        m_unc, unc_steps = uncertainty_chains_needed(self.method, ar_steps)
        rollout = self.policy.rollout([m["prompt"] for m in metas], seeds=seeds[mine],
                                      speculative_steps=speculative_steps_needed(self.method, ar_steps),
                                      extra_chains=m_unc, extra_chain_steps=unc_steps, sde_steps=sde_steps)
        t_roll = time.time() - t0
        # The reward scores CPU images (the world's pixel evaluator); rewards, advantages
        # and the loss are float32 on the policy's device.
        images = rollout.images.cpu()
        rewards = self.reward(images, rollout.prompts, metas).float().to(self.device)
        monitored = self.monitor(images, metas) if self.monitor else None
        adv = group_advantages(rewards, groups)
        plans = plan_tokens(self.scorer(rollout), rollout, ar_steps, head_steps, self.method)
        if m_unc:  # the plans hold the selected tokens' chains; the others' go now
            rollout = dataclasses.replace(rollout, steps=[dataclasses.replace(st, extra_chain=None, extra_logp=None)
                                                          for st in rollout.steps])
        base_rewards = None
        if self.method.paired_base:
            # Noise is a function of the image seeds (models/noise.py), so the base draws
            # what the policy drew; no trainer generator is touched and training is unchanged.
            with torch.no_grad():
                base = self.ref.rollout([m["prompt"] for m in metas], seeds=seeds[mine], sde_steps=sde_steps)
            base_rewards = self.reward(base.images.cpu(), base.prompts, metas).float().to(self.device)
        return Batch(groups, rollout, rewards, adv, plans, t_roll, base_rewards, monitored)

    def update(self, batch: Batch) -> dict[str, float]:
        """One GRPO update on a collected batch (train.inner_epochs passes over it); returns
        loss/*, diag/* and the gradient norms.

        Non-finite guard: a pass whose loss or gradient is not finite leaves the weights
        alone (its gradients are dropped and the update ends); max_nonfinite_in_row such
        updates in a row, or an update that makes the weights non-finite, raise
        NonFiniteError, so the weights are finite whenever this returns (training/loop.py
        writes them)."""
        t = self.tcfg
        skipped = False
        for _ in range(t.inner_epochs):
            stats = self.compute_grads(batch, norms=True)  # score -> loss of every AR step -> backward -> all-reduce
            if not all(math.isfinite(stats[k]) for k in ("loss/policy", "loss/kl", *NORM_KEYS)):
                skipped = True
                self.opt.zero_grad(set_to_none=True)
                break
            torch.nn.utils.clip_grad_norm_(self.trained, t.grad_clip)
            self.opt.step()
        self.sched.step()
        self.step += 1
        self.nonfinite_in_row = self.nonfinite_in_row + 1 if skipped else 0
        self.nonfinite_total += int(skipped)
        # only the trained parameters change; one check over all of them, one host sync
        if not bool(torch.stack([torch.isfinite(p).all() for p in self.trained]).all()):
            raise NonFiniteError(f"the update of step {self.step} made the weights non-finite "
                                 f"(lr {self.sched.get_last_lr()[0]:g}); lower train.lr.")
        if self.nonfinite_in_row >= t.max_nonfinite_in_row:
            raise NonFiniteError(f"{self.nonfinite_in_row} steps in a row had a non-finite loss or gradient "
                                 f"(step {self.step}); lower train.lr or check the reward.")
        return {**stats, "diag/lr": self.sched.get_last_lr()[0], "diag/nonfinite_skipped": float(self.nonfinite_total)}

    def score_step(self, rollout: Rollout, plan: TokenPlan, scorer: ChainScorer,
                   ref: ChainScorer | None) -> StepScores:
        """Every log-prob the loss of one AR step reads, at the current parameters: the
        rollout chains of the plan's blocks, one block at a time in the rollout's shapes (so
        that at theta_old they equal the recorded ones bit for bit: ratio exactly 1), the
        reference's means on the same transitions (ref: None without a KL term), and the
        plan's multi-trajectory chains (the M chains of a token share its latents)."""
        steps = plan.head_steps.tolist()  # the S loss head steps (CPU)
        z_c, z_u = self.policy.encode(rollout, plan.index)  # [B, N, C] latents of the AR step (cond, null)
        if ref is not None:
            with torch.no_grad():
                ref_c, ref_u = self.ref.encode(rollout, plan.index)
        logp, mean, std, ref_mean = [], [], [], [] if ref is not None else None
        for blk in plan.blocks:
            lp, m, s = scorer.log_probs(gather_rows(z_c, blk.idx), gather_rows(z_u, blk.idx), blk.chain, steps)
            logp.append(lp)  # [S, B, g]
            mean.append(m)  # [S, B, g, D]
            std.append(s)
            if ref is not None:
                with torch.no_grad():
                    ref_mean.append(ref.log_probs(gather_rows(ref_c, blk.idx), gather_rows(ref_u, blk.idx),
                                                  blk.chain, steps)[1])
        chain_logp, d = None, plan.draw
        if d is not None and d.rows.numel():
            b, width = plan.mask.shape
            z_rows = [gather_rows(z, plan.positions).reshape(b * width, -1)[d.rows] for z in (z_c, z_u)]  # [R, C]
            chain_logp = scorer.log_probs(*z_rows, d.states, steps)[0]  # [S, M, R]
        return StepScores(logp, mean, std, ref_mean, chain_logp)

    def compute_grads(self, batch: Batch, image_weight: torch.Tensor | None = None,
                      plans: list[TokenPlan] | None = None, adv: torch.Tensor | None = None,
                      norms: bool = False) -> dict[str, float]:
        """Set .grad to the gradient of the GRPO loss of `batch`, summed over ranks; returns
        loss/policy and loss/kl (summed over ranks) and diag/clipfrac and diag/approx_kl
        (averaged over ranks); with `norms`, also diag/grad_norm_ar and diag/grad_norm_head
        of the summed gradient. Every statistic is read from the device in one host sync.

        Per loss AR step: score_step, then method/losses.py step_loss, then backward.
        image_weight: optional [B] 0/1, the images in the loss (the gradient probe's group
        halves); plans, adv: another token plan or other advantages for the same rollout
        (the probe, tests).
        """
        t, rollout = self.tcfg, batch.rollout
        plans = batch.plans if plans is None else plans
        adv = batch.adv if adv is None else adv  # [B]
        w = torch.ones(adv.shape[0], device=adv.device) if image_weight is None else image_weight.float()  # [B]
        # The normaliser, the one constant every term is divided by: the images in the loss
        # over the global batch (every rank's) x the transition slots per image (the tokens
        # committed at the loss AR steps x the loss head steps). Every scored transition then
        # weighs the same whatever its AR step; speculative tokens add terms, not slots; and
        # the sum of the ranks' gradients (all_reduce_grads) is the global batch's gradient.
        [n_images] = self.world.sum([float(adv.numel() if image_weight is None else image_weight.sum())])
        slots = sum(p.n_committed * len(p.head_steps) for p in plans)
        normaliser = max(n_images, 1.0) * max(slots, 1)
        scorer = self.scorer(rollout)
        ref = self.scorer(rollout, reference=True) if self.ref is not None and t.beta_kl > 0 else None
        pg_vals, kl_vals, moved = [], [], []  # scalar tensors per AR step / chain set, read at the end
        self.opt.zero_grad(set_to_none=True)
        for plan in plans:
            scores = self.score_step(rollout, plan, scorer, ref)  # every log-prob the step's loss reads
            step = step_loss(plan, scores, adv, w, normaliser, t.clip_range, t.beta_kl)
            # Backward per AR step rather than of the summed loss: the same gradient (the
            # steps' gradients add up in .grad), while this step's activations (its transformer
            # pass and every head pass) are freed before the next step's exist.
            step.loss.backward()
            pg_vals.append(step.policy)
            kl_vals += [] if step.kl is None else [step.kl]
            moved += step.moved
        self.world.all_reduce_grads(self.trained)
        groups = {"loss/policy": pg_vals, "loss/kl": kl_vals, "diag/clipfrac": [st["clipfrac"] for st in moved],
                  "diag/approx_kl": [st["approx_kl"] for st in moved]}
        if norms:
            groups |= dict(zip(NORM_KEYS, (_grad_norm(self.ar_params), _grad_norm(self.head_params))))
        read = read_all(groups)
        # sums in the order of the AR steps and chain sets; clipfrac, approx_kl: mean of the sets' means
        stats = {k: sum(read[k], 0.0) for k in ("loss/policy", "loss/kl", "diag/clipfrac", "diag/approx_kl")}
        stats["diag/clipfrac"] /= max(len(moved), 1)
        stats["diag/approx_kl"] /= max(len(moved), 1)
        keys = sorted(stats)
        total = dict(zip(keys, self.world.sum([stats[k] for k in keys])))
        out = {k: v if k.startswith("loss/") else v / self.world.size for k, v in total.items()}
        if norms:
            out |= {k: (read[k] or [0.0])[0] for k in NORM_KEYS}
        return out


def _grad_norm(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """[the L2 norm of the parameters' gradients], or [] when none has one (a frozen group)."""
    gs = [p.grad for p in params if p.grad is not None]
    return [torch.linalg.vector_norm(torch.stack([g.norm() for g in gs]))] if gs else []

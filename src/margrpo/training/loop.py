"""The outer training loop of one (method, seed): steps, held-out evaluation, checkpoints.

    trainer = Trainer.from_params(params, "grpo_frozen", seed=0, prompts=train_prompts)
    final = train(trainer, out_dir, evaluate=heldout_eval)

Files in out_dir (RunDir): ckpt.pt (trainer state, written atomically every
train.checkpoint_every steps and at the end), history.jsonl (one JSON line of training
metrics per step), evals.jsonl (one line per held-out evaluation: step 0, every
train.eval_every steps and the last step), best/ (weights of the best held-out score so
far, with best.json), final/ (the weights after the last step). A killed run restarts from
ckpt.pt and drops the history and evaluation lines written after it, so a resumed run ends
with the same files as an uninterrupted one.

One step (`train_step`) reads as data flowing: `batch = trainer.collect()`, then what only
reads the batch (its metrics; the gradient probe when due), then `trainer.update(batch)`.
The last batch's selection maps are kept for the report (`save_selection_examples`).

Non-finite values: Trainer.update skips a step whose loss or gradient is not finite and
raises NonFiniteError when an update makes the weights non-finite or after
train.max_nonfinite_in_row skipped steps in a row. The run stops there, with the error
naming the newest checkpoint that exists, so from a finite base model a checkpoint, best/
and final/ only ever hold finite weights.

Data parallel (ranks/distributed.py): every rank runs this loop (the training steps and the
held-out evaluation are collective); rank 0 alone logs and writes the files. A checkpoint
holds only rank-independent state (weights, optimizer, scheduler, the shared generators),
so a run resumes with another number of processes.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from margrpo.atomic import replace_dir, write_with
from margrpo.checkfiles import check_torch_zip
from margrpo.jsonl import read_jsonl, write_jsonl
from margrpo.training.gradprobe import probe_gradients
from margrpo.training.stepstats import batch_metrics
from margrpo.training.trainer import Batch, NonFiniteError, Trainer

Evaluate = Callable[[object], dict[str, float]]
Log = Callable[[int, dict[str, float]], None]
SELECT_KEY = "eval/geneval/overall"


def _json_line(row: dict) -> str:
    """One strict JSON line: non-finite floats become null (JSON has no NaN)."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
    return json.dumps(clean, allow_nan=False)


class RunDir:
    """The files of one training run (module docstring)."""

    def __init__(self, out_dir: Path):
        self.root = Path(out_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ckpt, self.history, self.evals = self.root / "ckpt.pt", self.root / "history.jsonl", self.root / "evals.jsonl"
        self.best, self.final = self.root / "best", self.root / "final"

    def append(self, path: Path, step: int, row: dict) -> None:
        with open(path, "a") as f:
            f.write(_json_line({"step": step, **row}) + "\n")

    def rows(self, path: Path) -> list[dict]:
        return read_jsonl(path) if path.exists() else []

    def keep_until(self, step: int) -> None:
        """Drop the lines written after `step` (the killed tail is redone)."""
        for path in (self.history, self.evals):
            write_jsonl([r for r in self.rows(path) if r["step"] <= step], path)

    def resume(self, trainer: Trainer, tidy: bool = True) -> None:
        """Load ckpt.pt when there is one; tidy (rank 0): drop the lines after it, or all
        of them for a fresh run."""
        if self.ckpt.exists():
            fix = "delete it to restart this run from step 0"
            check_torch_zip(self.ckpt, fix)  # a truncated file names itself, before torch.load
            # CPU: the generator states must stay there; load_state copies the weights and the
            # optimizer state onto the parameters' device
            trainer.load_state(torch.load(self.ckpt, weights_only=False, map_location="cpu"))
            if tidy:
                self.keep_until(trainer.step)
        elif tidy:  # a fresh run: no stale lines from an earlier, different run
            for path in (self.history, self.evals):
                path.unlink(missing_ok=True)

    def save_checkpoint(self, trainer: Trainer) -> None:
        state = trainer.state()
        write_with(self.ckpt, lambda tmp: torch.save(state, tmp))

    def newest_checkpoint(self) -> str:
        if self.ckpt.exists():
            step = torch.load(self.ckpt, weights_only=False, map_location="cpu")["step"]
            return f"The last good checkpoint is {self.ckpt} (step {step}); a rerun resumes from it."
        return f"No checkpoint was written yet ({self.ckpt} does not exist); a rerun starts from the base model."

    def publish(self, policy, folder: Path) -> Path:
        staged = folder.with_name(folder.name + ".tmp")
        policy.save_pretrained(staged)
        return replace_dir(staged, folder)

    def record_eval(self, trainer: Trainer, scores: dict[str, float], select_key: str) -> dict[str, float]:
        """Append the evaluation; keep best/ when it improves the held-out score."""
        score = scores.get(select_key, -math.inf)
        row = dict(scores)
        if score > trainer.best["score"]:
            trainer.best = {"step": trainer.step, "score": score}
            self.publish(trainer.policy, self.best)
            (self.best / "best.json").write_text(json.dumps({**trainer.best, "select_key": select_key}) + "\n")
        row["eval/best_step"] = float(trainer.best["step"])
        self.append(self.evals, trainer.step, row)
        return row


def train(trainer: Trainer, out_dir: Path, *, evaluate: Evaluate | None = None, log: Log | None = None,
          progress: bool = True, select_key: str = SELECT_KEY) -> Path:
    """Train to train.steps (resuming from out_dir); returns out_dir/final. evaluate(policy)
    -> held-out metrics, called at step 0, every train.eval_every steps and at the end."""
    run, t, main = RunDir(out_dir), trainer.tcfg, trainer.world.main
    run.resume(trainer, tidy=main)
    trainer.world.barrier()  # every rank reads the files as rank 0 left them
    log = log if (log is not None and main) else (lambda step, metrics: None)

    def held_out() -> None:  # collective: every rank samples its share of the images
        scores = evaluate(trainer.policy)
        if main:
            log(trainer.step, run.record_eval(trainer, scores, select_key))

    eval_steps = {0, t.steps} | (set(range(t.eval_every, t.steps, t.eval_every)) if t.eval_every else set())
    done_evals = {r["step"] for r in run.rows(run.evals)}
    if evaluate is not None and 0 in eval_steps and trainer.step == 0 and 0 not in done_evals:
        held_out()
    bar = tqdm(total=t.steps, initial=trainer.step, desc=f"train {trainer.method.name} seed {trainer.seed}",
               disable=not (progress and main))
    batch = None
    while trainer.step < t.steps:
        batch = None  # the previous batch goes before the next one exists
        try:
            metrics, batch = train_step(trainer)
        except NonFiniteError as e:
            raise NonFiniteError(f"{e} {run.newest_checkpoint()}") from None
        if main:
            run.append(run.history, trainer.step, metrics)
        log(trainer.step, metrics)
        if evaluate is not None and trainer.step in eval_steps:
            held_out()
        if main and (trainer.step % t.checkpoint_every == 0 or trainer.step == t.steps):
            run.save_checkpoint(trainer)
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}")
    bar.close()
    if main:
        if batch is not None:
            save_selection_examples(batch, run.root / "selection_examples.pt")
        run.publish(trainer.policy, run.final)
    trainer.world.barrier()  # final/ exists when any rank returns
    return run.final


def train_step(trainer: Trainer) -> tuple[dict[str, float], Batch]:
    """One training step: collect a batch, read it (metrics; the gradient probe when
    train.grad_probe_every says so, on the batch before its update), update on it.
    Returns (the step's metrics, the batch)."""
    t0, every = time.time(), trainer.tcfg.grad_probe_every
    batch = trainer.collect()  # rollout -> reward -> group advantages -> token plan
    metrics = batch_metrics(batch, trainer.world)
    if every and trainer.step % every == 0:
        metrics |= probe_gradients(trainer, batch)  # same batch, before the update; changes nothing
    metrics |= trainer.update(batch)  # score -> loss -> backward -> optimiser step
    metrics["time/step"] = time.time() - t0
    return metrics, batch


def save_selection_examples(batch: Batch, path: Path, n_images: int = 4) -> None:
    """Loss-token and top-k maps of a batch's first images, for the report (methods with a
    multi-trajectory estimate only: the others select nothing)."""
    if all(p.draw is None for p in batch.plans):
        return
    ro = batch.rollout
    b, n_tok = ro.tokens.shape[:2]
    ex = {"images": ro.images[:n_images].cpu(), "prompts": ro.prompts[:n_images], "steps": []}
    for p in batch.plans:
        pos = p.positions.cpu()
        loss_map = torch.zeros(b, n_tok).scatter_(1, pos, p.mask.float().cpu())
        chosen = torch.zeros(b * pos.shape[1])
        if p.draw is not None and p.draw.rows.numel():
            chosen[p.draw.rows.cpu()] = 1.0
        sel = torch.zeros(b, n_tok).scatter_(1, pos, chosen.view(b, -1))
        ex["steps"].append({"ar_step": p.index, "loss_tokens": loss_map[:n_images], "selected": sel[:n_images]})
    torch.save(ex, path)

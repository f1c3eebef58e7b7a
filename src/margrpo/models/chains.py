"""Head chains over any `MARPolicy`: guided outputs, sampling and log-prob evaluation, and
the rollout itself (`RolloutMixin`, shared by TinyMAR and the adapters).

One code path serves the rollout, the recomputation in the loss, the uncertainty map and
the multi-trajectory estimators, so that "recompute == rollout" holds by construction:
the guided head output is always computed on the concatenated [cond; null] rows in one
call, with the same shapes as at rollout.

Shapes: a chain has states [T+1, *rows, D]; z_c, z_u: [*rows, C].
"""
from __future__ import annotations

from typing import Sequence

import torch

from margrpo.models.noise import resolve_seeds
from margrpo.models.protocol import ARStep, MARPolicy, Rollout
from margrpo.models.samplers import gaussian_log_prob

CFG_MODES = ("guided", "guided_full", "cond")


def guided_output(
    policy: MARPolicy,
    x: torch.Tensor,
    j: int,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    cfg_scale: float,
    cfg_mode: str = "guided",
) -> torch.Tensor:
    """Head output used for the Gaussian mean at head step j. x: [*rows, D].

    guided: u + w (c - u), the distribution the rollout sampled from (method.md §2), with no
      gradient through the null-prompt branch u (a common choice: the update then moves
      only the prompted branch, and a prompt-independent change counts w times).
    guided_full: the same mean with the exact gradient w dc + (1 - w) du (train.cfg_null_grad).
    cond: c alone, what the authors' training code scores (kept for comparison).
    A policy whose head output has channels that are not guided (Harmon's learned
    variance) defines `guide(c, u, w)`; the output may be wider than D ([*rows, D'])."""
    rows = x.shape[:-1]
    xf, zc, zu = x.reshape(-1, x.shape[-1]), z_c.reshape(-1, z_c.shape[-1]), z_u.reshape(-1, z_u.shape[-1])
    r = xf.shape[0]
    t = torch.full((2 * r,), policy.sampler.time_input(j), device=x.device)
    out = policy.head_output(torch.cat([xf, xf]), t, torch.cat([zc, zu]))
    c, u = out[:r], out[r:]
    if cfg_mode == "cond":
        g = c
    elif cfg_mode in ("guided", "guided_full"):
        if cfg_mode == "guided":
            u = u.detach()
        guide = getattr(policy, "guide", None)
        g = guide(c, u, cfg_scale) if guide is not None else u + cfg_scale * (c - u)
    else:
        raise ValueError(f"cfg_mode must be one of {CFG_MODES}, got {cfg_mode!r}")
    return g.reshape(*rows, g.shape[-1])


def sample_chain(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    noise: torch.Tensor,
    cfg_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the head from noise[0] with step noises noise[1..T] (all [*rows, D]).

    Returns chain [T+1, *rows, D], mean [T, *rows, D], std [T, *rows], logp [T, *rows].
    """
    sampler = policy.sampler
    x = noise[0]
    chain, means, stds, logps = [x], [], [], []
    for j in range(sampler.num_steps):
        out = guided_output(policy, x, j, z_c, z_u, cfg_scale)
        x, mean, std, lp = sampler.step(x, j, out, noise[j + 1])
        chain.append(x)
        means.append(mean)
        stds.append(std)
        logps.append(lp)
    return torch.stack(chain), torch.stack(means), torch.stack(stds), torch.stack(logps)


def chain_log_probs(
    policy: MARPolicy,
    z_c: torch.Tensor,
    z_u: torch.Tensor,
    states: torch.Tensor,
    head_steps: Sequence[int],
    cfg_scale: float,
    cfg_mode: str = "guided",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Policy transition log-probs of given states [T+1, *rows, D] at `head_steps`.

    Returns (logp, mean, std) stacked over head_steps: [S, *rows], [S, *rows, D], [S, *rows].
    """
    logps, means, stds = [], [], []
    for j in head_steps:
        out = guided_output(policy, states[j], j, z_c, z_u, cfg_scale, cfg_mode)
        mean, std = policy.sampler.transition(states[j], j, out)
        logps.append(gaussian_log_prob(states[j + 1], mean, std))
        means.append(mean)
        stds.append(std)
    return torch.stack(logps), torch.stack(means), torch.stack(stds)


def gather_rows(z: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """z: [B, N, C], idx: [B, n] -> [B, n, C]."""
    return torch.gather(z, 1, idx.unsqueeze(-1).expand(-1, -1, z.shape[-1]))


def scatter_tokens(canvas: torch.Tensor, idx: torch.Tensor, tokens: torch.Tensor) -> None:
    """canvas [B, N, D] <- tokens [B, n, D] at positions idx [B, n], in place."""
    canvas.scatter_(1, idx.unsqueeze(-1).expand(-1, -1, canvas.shape[-1]), tokens)


class RolloutMixin:
    """`rollout` and `encode` of a MARPolicy (TinyMAR and the NOVA / Harmon adapters) from
    its model-specific pieces:
      prepare_cond(prompts) -> cond              conditioning, kept on the Rollout for `encode`
      encode_pair(cond, canvas, known) -> (z_cond, z_null), each [B, N, C]
      token_order(seeds [B]) -> [B, N]           each image's commit order (its device is the
                                                 canvas's)
      step_noise(seeds, i, idx, rest) -> (committed [T+1, B, n, D], speculative
                                          [T+1, B, m, D] or None); seeds on the canvas's
                                          device; rest is None unless step i records
                                          speculative tokens
      decode_tokens(tokens [B, N, D]) -> images [B, 3, H, W] in [0, 1]
    and schedule, num_tokens, token_dim, sampler, cfg_scale, temperature."""

    def encode(self, rollout: Rollout, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = rollout.steps[step]
        return self.encode_pair(rollout.cond, s.canvas, s.known)

    @torch.no_grad()
    def rollout(
        self,
        prompts: Sequence[str],
        *,
        seeds: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        speculative_steps: Sequence[int] = (),
    ) -> Rollout:
        """One image per prompt (repeat a prompt G times for a group). seeds: [B] int64, one
        per image, from which all its randomness derives (drawn from `generator` when None),
        recorded on the Rollout so that the image can be replayed.

        AR step i commits the next schedule[i] tokens of each image's order, drawn by the
        guided head chain from the transformer's output on the current canvas. At the steps
        in `speculative_steps` the still-masked tokens are also drawn, from their own noise
        (so recording them never changes the image), and kept on the step's record, as the
        authors' loss reads them."""
        b = len(prompts)
        seeds = resolve_seeds(seeds, b, generator)
        cond = self.prepare_cond(prompts)
        order = self.token_order(seeds)  # [B, N]
        dev_seeds = seeds.to(order.device)
        canvas = torch.zeros(b, self.num_tokens, self.token_dim, device=order.device)
        known = torch.zeros(b, self.num_tokens, dtype=torch.bool, device=order.device)
        steps, start, spec_set = [], 0, set(speculative_steps)
        for i, n in enumerate(self.schedule):
            z_c, z_u = self.encode_pair(cond, canvas, known)
            idx, rest = order[:, start : start + n], order[:, start + n :]
            spec = i in spec_set
            eps, spec_eps = self.step_noise(dev_seeds, i, idx, rest if spec else None)
            chain, mean, std, logp = sample_chain(self, gather_rows(z_c, idx), gather_rows(z_u, idx), eps,
                                                  self.cfg_scale)
            rec = ARStep(i, canvas.clone(), known.clone(), idx, chain, mean, std, logp)
            if spec:
                rec.speculative = canvas.clone()
                scatter_tokens(rec.speculative, idx, chain[-1])
                rec.spec_idx = rest
                if rest.shape[1]:
                    sc, _, _, sl = sample_chain(self, gather_rows(z_c, rest), gather_rows(z_u, rest), spec_eps,
                                                self.cfg_scale)
                    scatter_tokens(rec.speculative, rest, sc[-1])
                    rec.spec_chain, rec.spec_logp = sc, sl
            steps.append(rec)
            scatter_tokens(canvas, idx, chain[-1])
            known.scatter_(1, idx, True)
            start += n
        return Rollout(prompts=list(prompts), images=self.decode_tokens(canvas), tokens=canvas, steps=steps,
                       seeds=seeds, cfg_scale=self.cfg_scale, temperature=self.temperature, cond=cond,
                       extras={"order": order})


def recompute_log_probs(
    policy: MARPolicy,
    rollout: Rollout,
    ar_steps: Sequence[int] | None = None,
    head_steps: Sequence[int] | None = None,
    cfg_mode: str = "guided",
) -> torch.Tensor:
    """Log-probs of the rollout's own transitions under the current parameters.

    Returns [len(ar_steps), len(head_steps), B, n] (requires equal n_i over the chosen
    steps; use one step at a time otherwise). With unchanged parameters this equals the
    recorded `step.logp` (same shapes, same ops).
    """
    ar_steps = range(len(rollout.steps)) if ar_steps is None else ar_steps
    head_steps = range(policy.sampler.num_steps) if head_steps is None else head_steps
    out = []
    for i in ar_steps:
        step = rollout.steps[i]
        z_c, z_u = policy.encode(rollout, i)
        zc, zu = gather_rows(z_c, step.commit_idx), gather_rows(z_u, step.commit_idx)
        lp, _, _ = chain_log_probs(policy, zc, zu, step.chain, head_steps, rollout.cfg_scale, cfg_mode)
        out.append(lp)
    return torch.stack(out)

"""The rollout of any `MARPolicy` (`RolloutMixin`, shared by TinyMAR and the NOVA / Harmon
adapters): AR steps that each commit tokens drawn by the guided head chains of
models/chains.py, with the record (models/protocol.py `Rollout`) that replays and rescores
them.
"""
from __future__ import annotations

from typing import Sequence

import torch

from margrpo.models.chains import gather_rows, sample_chain, sample_chain_with_extras, scatter_tokens
from margrpo.models.noise import UNCERTAINTY, chain_stream, resolve_seeds
from margrpo.models.noise import chain_noise as counter_noise
from margrpo.models.protocol import ARStep, Rollout


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
        extra_chains: int = 0,
        extra_chain_steps: Sequence[int] = (),
        sde_steps: Sequence[int] | None = None,
    ) -> Rollout:
        """One image per prompt (repeat a prompt G times for a group). seeds: [B] int64, one
        per image, from which all its randomness derives (drawn from `generator` when None),
        recorded on the Rollout so that the image can be replayed.

        AR step i commits the next schedule[i] tokens of each image's order, drawn by the
        guided head chain from the transformer's output on the current canvas. At the steps
        in `speculative_steps` the still-masked tokens are also drawn, from their own noise
        (so recording them never changes the image), and kept on the step's record, as the
        authors' loss reads them. At the steps in `extra_chain_steps`, `extra_chains` (M)
        more chains per committed token are drawn from the same latents on the noise streams
        chain_stream(UNCERTAINTY, 0..M-1) and kept on the step (ARStep.extra_chain): the
        chains of method/plan.py's uncertainty map, drawn here because they share the step's
        transformer pass and the head's conditioning; they never change the image.
        sde_steps: the SDE window, the head transitions drawn stochastically (None: all);
        the others take the sampler's deterministic step, and the extra chains branch at
        the window (sample_chain_with_extras). Recorded on the Rollout, since replaying an
        image needs it."""
        b = len(prompts)
        seeds = resolve_seeds(seeds, b, generator)
        cond = self.prepare_cond(prompts)
        order = self.token_order(seeds)  # [B, N]
        dev_seeds = seeds.to(order.device)
        canvas = torch.zeros(b, self.num_tokens, self.token_dim, device=order.device)
        known = torch.zeros(b, self.num_tokens, dtype=torch.bool, device=order.device)
        steps, start, spec_set = [], 0, set(speculative_steps)
        extra_set = set(extra_chain_steps) if extra_chains > 0 else set()
        t1, d = self.sampler.num_steps + 1, self.token_dim
        for i, n in enumerate(self.schedule):
            z_c, z_u = self.encode_pair(cond, canvas, known)
            idx, rest = order[:, start : start + n], order[:, start + n :]
            spec = i in spec_set
            eps, spec_eps = self.step_noise(dev_seeds, i, idx, rest if spec else None)
            zi_c, zi_u = gather_rows(z_c, idx), gather_rows(z_u, idx)
            extra = None
            if i in extra_set:
                extra_eps = torch.stack([counter_noise(dev_seeds, i, idx, t1, d, chain_stream(UNCERTAINTY, c))
                                         for c in range(extra_chains)], dim=1)  # [T+1, M, B, n, D]
                (chain, mean, std, logp), extra = sample_chain_with_extras(self, zi_c, zi_u, eps, extra_eps,
                                                                           self.cfg_scale, sde_steps)
            else:
                chain, mean, std, logp = sample_chain(self, zi_c, zi_u, eps, self.cfg_scale, sde_steps)
            rec = ARStep(i, canvas.clone(), known.clone(), idx, chain, mean, std, logp)
            if extra is not None:
                rec.extra_chain, rec.extra_logp = extra
            if spec:
                rec.speculative = canvas.clone()
                scatter_tokens(rec.speculative, idx, chain[-1])
                rec.spec_idx = rest
                if rest.shape[1]:
                    sc, _, _, sl = sample_chain(self, gather_rows(z_c, rest), gather_rows(z_u, rest), spec_eps,
                                                self.cfg_scale, sde_steps)
                    scatter_tokens(rec.speculative, rest, sc[-1])
                    rec.spec_chain, rec.spec_logp = sc, sl
            steps.append(rec)
            scatter_tokens(canvas, idx, chain[-1])
            known.scatter_(1, idx, True)
            start += n
        return Rollout(prompts=list(prompts), images=self.decode_tokens(canvas), tokens=canvas, steps=steps,
                       seeds=seeds, cfg_scale=self.cfg_scale, temperature=self.temperature, cond=cond,
                       extras={"order": order}, sde_steps=None if sde_steps is None else tuple(sde_steps))

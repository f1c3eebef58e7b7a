"""Measure the bias of `resample`'s selected-token term on the base model's real tokens.

`mar_grpo` ranks a step's committed tokens by the variance of M fresh head chains from the
token's latent z (the uncertainty map) and, for the top-k tokens, scores those same M chains
(`resample` reuses them, as the authors do). Fresh chains from z have a zero-mean score,
d/dz log p(chain | z), but only unconditionally: chains that were kept because they spread
widely are not a fresh draw. This measures the term on real rollouts of the base
model (params.model.checkpoint, training prompts):

- per committed token and per draw (`draws` independent repeats of its M chains, the
  uncertainty streams), the score of the term with A = 1 with respect to the token's
  latents, s = d/d(z_cond, z_null) of (1/M) sum over chains m and loss head steps j of
  log p(s_{j+1}^(m) | s_j^(m), z) ([2C]: what reaches the transformer), at the
  loss_head_window noisiest head steps, under the loss's cfg_mode;
- the selection of mar_grpo (top ceil(k n) tokens per image by chain variance, ranked over
  all its AR steps), separately for every draw;
- per AR step and over all, for the selected and the unselected tokens: |mean s|^2 against
  what a term with zero mean would give for as many independent scores, sum |s|^2 / n^2
  (the ratio is about 1 for a zero-mean term, and its square root is how many standard
  errors the mean lies from 0), the cosine between the two means, the mean uncertainty;
- the control: the selected tokens scored by M other, independent chains from the same z
  (the `resample` stream, what the estimator draws when it does not reuse): zero-mean.

probes/resample_bias.py prints the table (docs/method.md); tests/test_estimators.py runs
`measure` on the committed base at a small size.
"""
from __future__ import annotations

import math

import torch

from margrpo.config import Params
from margrpo.models.chains import chain_log_probs, gather_rows, sample_chains
from margrpo.models.noise import RESAMPLE, UNCERTAINTY, draw_seeds
from margrpo.method.estimators import image_noise
from margrpo.method.selection import topk_mask, uncertainty_map
from margrpo.world.prompts import make_prompt_set

SETS = ("selected", "unselected", "selected, independent chains")


def chain_scores(policy, zc: torch.Tensor, zu: torch.Tensor, states: torch.Tensor, steps: list[int],
                 cfg_scale: float, cfg_mode: str) -> torch.Tensor:
    """Per token, d/dz of (1/M) sum_m sum_{j in steps} log p(chain m's transition j | z):
    zc, zu [R, C]; states [T+1, M, R, D] -> [R, 2C] (zeros for the null half when cfg_mode
    sends no gradient there)."""
    zc, zu = zc.detach().requires_grad_(), zu.detach().requires_grad_()
    lp, _, _ = chain_log_probs(policy, zc, zu, states, steps, cfg_scale, cfg_mode)  # [S, M, R]
    gc, gu = torch.autograd.grad(lp.sum(0).mean(0).sum(), [zc, zu], allow_unused=True)
    return torch.cat([gc, torch.zeros_like(zu) if gu is None else gu], dim=-1)


class _TokenSums:
    """Per token of one AR step, running sums over the draws it falls in a set: of its
    score s [R, 2C], of |s|^2 [R] and the count [R]."""

    def __init__(self, r: int, dim: int) -> None:
        self.s = torch.zeros(r, dim, dtype=torch.float64)
        self.sq = torch.zeros(r, dtype=torch.float64)
        self.n = torch.zeros(r, dtype=torch.float64)

    def add(self, token: torch.Tensor, scores: torch.Tensor) -> None:
        """token: [K] long, the token of each score; scores [K, 2C]."""
        self.s.index_add_(0, token, scores.double())
        self.sq.index_add_(0, token, scores.double().pow(2).sum(-1))
        self.n.index_add_(0, token, torch.ones(token.shape[0], dtype=torch.float64))

    def mean(self) -> torch.Tensor:
        return self.s / self.n.clamp_min(1).unsqueeze(-1)

    def ratio(self) -> torch.Tensor:
        """[R] |mean s|^2 / (sum |s|^2 / n^2): about 1 when the token's score has zero mean."""
        return self.mean().pow(2).sum(-1) / (self.sq / self.n.clamp_min(1).pow(2)).clamp_min(1e-300)


def _draw_noise(ro, i: int, idx: torch.Tensor, purpose: int, draws: range, m: int, rows: torch.Tensor,
                t1: int, d: int) -> torch.Tensor:
    """[T+1, M, len(draws) * R, D]: the M chains' noise of the tokens `rows` of AR step i, for
    each draw in `draws` (rows of draw j after those of draw j - 1)."""
    return torch.cat([image_noise(ro.seeds, i, idx, purpose, j)(t1, m, rows, d) for j in draws], dim=2)


def training_prompts(params: Params, images: int, seed: int) -> tuple[list[str], torch.Tensor]:
    """`images` prompts drawn from the training split and their image seeds [images]."""
    gen = torch.Generator().manual_seed(seed)
    pool = make_prompt_set("train", params.world.train_prompts_per_tag, params.world.seed)
    prompts = [pool[int(i)]["prompt"] for i in torch.randint(len(pool), (images,), generator=gen)]
    return prompts, draw_seeds(gen, images)


def measure(policy, params: Params, prompts: list[str], seeds: torch.Tensor, draws: int, chunk: int = 16) -> dict:
    """The measurement (module docstring) on rollouts of `policy` (one image per prompt, from
    `seeds`), per token over `draws` independent draws of its M chains (a token's ratio
    needs it in a set twice), `chunk` draws at a time in one batch of chains.

    Returns {"rows": {AR step or "all": {set: {"tokens", "ratio", "draws", "unc"}, "cos",
    "both"}}, "m", "k", "head_steps"}: per set the mean over tokens of the per-token ratio,
    of the number of draws in the set and of the uncertainty; cos: the mean over tokens of
    cosine(mean selected, mean unselected)."""
    images = len(prompts)
    m, k, cfg_mode = params.num_trajectories, params.k, params.train.cfg_mode
    t1, d_tok = policy.sampler.num_steps + 1, policy.token_dim
    steps = list(range(min(t1 - 1, params.train.loss_head_window or t1 - 1)))
    for p in policy.parameters():
        p.requires_grad_(False)
    policy.eval()
    with torch.no_grad():
        ro = policy.rollout(prompts, seeds=seeds)
        latents = []  # per AR step: (z_cond, z_null) [B * n_i, C] of its committed tokens
        for i, st in enumerate(ro.steps):
            z_c, z_u = policy.encode(ro, i)
            latents.append(tuple(gather_rows(z, st.commit_idx).reshape(-1, z.shape[-1]) for z in (z_c, z_u)))
    dim = 2 * latents[0][0].shape[-1]
    sums = [{name: _TokenSums(st.commit_idx.numel(), dim) for name in SETS} for st in ro.steps]
    unc_sum = [torch.zeros(st.commit_idx.numel(), 2, dtype=torch.float64) for st in ro.steps]  # (selected, not)
    for start in range(0, draws, chunk):
        block = range(start, min(draws, start + chunk))
        c = len(block)
        chains, uncs = [], []
        for i, st in enumerate(ro.steps):
            r = st.commit_idx.numel()
            with torch.no_grad():
                noise = _draw_noise(ro, i, st.commit_idx, UNCERTAINTY, block, m, torch.arange(r), t1, d_tok)
                states, _ = sample_chains(policy, *(z.repeat(c, 1) for z in latents[i]), noise, ro.cfg_scale)
            chains.append(states)  # [T+1, M, c * R, D]
            uncs.append(uncertainty_map(states[-1].unsqueeze(1)).view(c * images, -1))  # [c * B, n_i]
        widths = [u.shape[1] for u in uncs]
        selected = torch.split(topk_mask(torch.cat(uncs, dim=1), k), widths, dim=1)  # mar_grpo's "image" pool
        for i, st in enumerate(ro.steps):
            r = st.commit_idx.numel()
            sel, unc = selected[i].reshape(-1), uncs[i].reshape(-1)  # [c * R]
            zs = [z.repeat(c, 1) for z in latents[i]]
            scores = chain_scores(policy, *zs, chains[i], steps, ro.cfg_scale, cfg_mode)  # [c * R, 2C]
            rows, rest = sel.nonzero().squeeze(-1), (~sel).nonzero().squeeze(-1)
            with torch.no_grad():
                noise = torch.cat([_draw_noise(ro, i, st.commit_idx, RESAMPLE, [j], m, rows[rows // r == j - start] % r,
                                               t1, d_tok) for j in block], dim=2)
                fresh, _ = sample_chains(policy, zs[0][rows], zs[1][rows], noise, ro.cfg_scale)
            control = chain_scores(policy, zs[0][rows], zs[1][rows], fresh, steps, ro.cfg_scale, cfg_mode)
            sums[i]["selected"].add(rows % r, scores[rows])
            sums[i]["unselected"].add(rest % r, scores[rest])
            sums[i]["selected, independent chains"].add(rows % r, control)
            unc_sum[i][:, 0].index_add_(0, rows % r, unc[rows].double())
            unc_sum[i][:, 1].index_add_(0, rest % r, unc[rest].double())
    per_step = [_summary(s, u) for s, u in zip(sums, unc_sum)]
    every = {name: _TokenSums(0, dim) for name in SETS}
    for name in SETS:  # all AR steps: the tokens of every step together
        for field in ("s", "sq", "n"):
            setattr(every[name], field, torch.cat([getattr(s[name], field) for s in sums]))
    rows = {i: r for i, r in enumerate(per_step)}
    rows["all"] = _summary(every, torch.cat(unc_sum))
    return {"rows": rows, "m": m, "k": k, "head_steps": steps}


def _summary(sums: dict[str, _TokenSums], unc_sum: torch.Tensor) -> dict:
    """Means over the tokens that fell in a set at least twice (a ratio needs two scores)."""
    out = {}
    for j, name in enumerate(SETS):
        ok = sums[name].n >= 2
        unc = unc_sum[:, min(j, 1) if name != SETS[2] else 0] / sums[name].n.clamp_min(1)
        out[name] = {"tokens": int(ok.sum()), "ratio": float(sums[name].ratio()[ok].mean()) if ok.any() else math.nan,
                     "draws": float(sums[name].n[ok].mean()) if ok.any() else math.nan,
                     "unc": float(unc[ok].mean()) if ok.any() else math.nan}
    both = (sums["selected"].n >= 2) & (sums["unselected"].n >= 2)
    cos = torch.nn.functional.cosine_similarity(sums["selected"].mean(), sums["unselected"].mean(), dim=-1)
    out["cos"] = float(cos[both].mean()) if both.any() else math.nan
    out["both"] = int(both.sum())
    return out

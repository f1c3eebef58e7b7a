"""Consistency scores of speculative tokens on base-model rollouts: centred vs raw cosine.

    .venv/bin/python probes/consistency_scores.py --batches 4 --seed 0

Rolls out --batches batches of --images training prompts (prompts/world_train.jsonl, drawn
with --seed, one image seed each) with the policy at model.checkpoint, recording the head's
speculative prediction of every still-masked token at every AR step (method.md §3.3). For
each speculative token n of step i it scores the prediction xhat_i[n] against the token
finally committed there, x_fin[n], two ways:
  centred  cos(xhat_i - r, x_fin - r), r = policy.consistency_reference (the filter's score)
  raw      cos(xhat_i, x_fin), the plain cosine (r = 0)
under the paper's rule (the score itself) and the authors' code rule (its improvement over
step i-1), and prints the score's 10/25/50/75/90% quantiles and the fraction of speculative
tokens the filter keeps (score > tau) at tau in {-1, 0, 0.5}, per AR step and pooled. It
also prints the measurement behind TinyMAR's reference: the mean token value of object
pixels (a channel below pixel 0.5) and of background pixels of the final images.
"""
from __future__ import annotations

import time

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.models.loading import load_model
from margrpo.method.selection import consistency_score

TAUS = (-1.0, 0.0, 0.5)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
RULES = ("paper", "code")


def step_scores(rollout, rule: str, reference: float) -> dict[int, torch.Tensor]:
    """AR step -> scores [B * m_i] of its speculative tokens (steps with none are left out)."""
    out = {}
    for i, st in enumerate(rollout.steps):
        if st.spec_idx is None or not st.spec_idx.shape[1]:
            continue
        prev = rollout.steps[i - 1].speculative if i > 0 else None
        s = consistency_score(st.speculative, rollout.tokens, rule, prev, reference)
        out[i] = torch.gather(s, 1, st.spec_idx).reshape(-1).cpu()
    return out


def ink_stats(tokens: torch.Tensor) -> tuple[float, float, float]:
    """(object pixel fraction, mean token value of object pixels, of background pixels) of
    pixel-patch tokens [B, N, 3 * p * p] ((c, y, x) inside a token)."""
    px = tokens.reshape(*tokens.shape[:2], 3, -1)  # [B, N, 3, p*p]
    obj = px.amin(2) < 0.0  # some channel below pixel 0.5: ink (every world colour has one <= 0.15)
    mean = px.mean(2)
    return obj.float().mean().item(), mean[obj].mean().item(), mean[~obj].mean().item()


def row(label: str, s: torch.Tensor) -> str:
    q = torch.quantile(s, torch.tensor(QUANTILES)).tolist()
    kept = [(s > t).float().mean().item() for t in TAUS]
    return (f"| {label} | {s.numel()} | " + " | ".join(f"{v:+.3f}" for v in q) + " | "
            + " | ".join(f"{v:.3f}" for v in kept) + " |")


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--images", type=int, default=64, help="images per batch (one prompt each)")
    ap.add_argument("--seed", type=int, default=0, help="prompt and image-seed draws")
    ap.add_argument("--reference", type=float, default=None, help="override the policy's consistency_reference")
    a = ap.parse_args()

    t0 = time.time()
    params = params_from_args(a)
    policy = load_model(params.model.checkpoint, params)
    ref = policy.consistency_reference if a.reference is None else a.reference
    prompts = [r["prompt"] for r in read_jsonl("prompts/world_train.jsonl")]
    gen = torch.Generator().manual_seed(a.seed)
    scores = {(rule, name): {} for rule in RULES for name in ("centred", "raw")}
    tokens = []
    with torch.no_grad():
        for _ in range(a.batches):
            pick = torch.randint(len(prompts), (a.images,), generator=gen).tolist()
            ro = policy.rollout([prompts[j] for j in pick], generator=gen,
                                speculative_steps=range(policy.num_ar_steps))
            tokens.append(ro.tokens.cpu())
            for rule in RULES:
                for name, r in (("centred", ref), ("raw", 0.0)):
                    for i, s in step_scores(ro, rule, r).items():
                        scores[(rule, name)].setdefault(i, []).append(s)

    print(f"{params.model.checkpoint}: {a.batches} batches x {a.images} images, seed {a.seed}, "
          f"{policy.num_ar_steps} AR steps committing {list(policy.schedule)} tokens; reference r = {ref:g}")
    if params.model.kind == "tiny":
        frac, ink, bg = ink_stats(torch.cat(tokens))
        print(f"final tokens: object pixels {frac:.3f} of all, mean token value {ink:+.3f}; background "
              f"{bg:+.3f}; midpoint {(ink + bg) / 2:+.3f}")
    head = ("| AR step | spec. tokens | " + " | ".join(f"q{round(100 * q)}" for q in QUANTILES) + " | "
            + " | ".join(f"kept tau={t:g}" for t in TAUS) + " |")
    for (rule, name), per_step in scores.items():
        what = "cos(xhat - r, x_fin - r)" if name == "centred" else "cos(xhat, x_fin)"
        if rule == "code":
            what += " minus the same at step i-1"
        print(f"\nrule {rule}, {name} score: {what}")
        print(head)
        print("|" + "---|" * (2 + len(QUANTILES) + len(TAUS)))
        for i in sorted(per_step):
            print(row(str(i), torch.cat(per_step[i])))
        print(row("pooled", torch.cat([torch.cat(v) for v in per_step.values()])))
    print(f"\n{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()

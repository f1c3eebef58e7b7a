"""Gradient signal-to-noise of loss variants on the same rollouts, without training.

    .venv/bin/python probes/grad_snr.py --batches 6 \
        --variant "default:" \
        --variant "all_ar:train.loss_ar_steps=16,methods.mar_grpo.token_scope=committed"

For each variant (name:key=value,... applied on top of the -S overrides) and each of
--batches rollout batches (same prompts and rollout seeds for every variant), the policy
gradient of the transformer is computed twice, once from each half of the groups (prompts;
the trainer's probe/snr split). The two halves are independent estimates of one expected
gradient, so over batches
    signal = mean(g_a . g_b)            estimates |E g|^2 (per half-batch)
    noise  = mean(|g_a - g_b|^2 / 2)    estimates trace Cov(g) (per half-batch)
and snr = signal / noise says how many steps the update needs before its drift follows the
reward rather than the sampling noise (about 1/snr). Also prints the mean cosine and the
loss-backward seconds for a full batch.
"""
from __future__ import annotations

import time

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.training.gradprobe import flat_grad, group_halves, pair_stats
from margrpo.training.trainer import Trainer


def measure(tr: Trainer, batches: int) -> dict[str, float]:
    sig, noise, cos, secs, ess = [], [], [], [], []
    for _ in range(batches):
        batch = tr.collect()
        ess += [float(p.draw.ess.mean()) for p in batch.plans if p.draw is not None and p.draw.ess.numel()]
        half = group_halves(batch.groups)
        grads = []
        for w in (half, ~half):
            t = time.time()
            tr.compute_grads(batch, w)
            secs.append(time.time() - t)
            grads.append(flat_grad([p.grad for p in tr.ar_params], tr.ar_params))
        st = pair_stats(*grads)
        sig.append(st["signal"])
        noise.append(st["noise_var"])
        cos.append(st["cosine"])
    s, n = sum(sig) / batches, sum(noise) / batches
    return {"snr": s / n, "cos": sum(cos) / batches, "signal": s, "noise": n,
            "backward_s": 2 * sum(secs) / len(secs), "ess": sum(ess) / len(ess) if ess else float("nan")}


def main() -> None:
    ap = script_parser(__doc__, overrides_help="dotted key=value (all variants)")
    ap.add_argument("--method", default="mar_grpo")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--variant", action="append", required=True, help="name:key=value,key=value")
    a = ap.parse_args()
    print(f"{'variant':28s} {'snr':>8s} {'cos':>7s} {'signal':>10s} {'noise':>10s} {'bwd_s':>6s} {'ess':>5s}")
    for v in a.variant:
        name, _, rest = v.partition(":")
        params = params_from_args(a, after=[x for x in rest.split(",") if x])
        tr = Trainer.from_params(params, a.method, a.seed, read_jsonl("prompts/world_train.jsonl"))
        r = measure(tr, a.batches)
        print(f"{name:28s} {r['snr']:8.4f} {r['cos']:7.4f} {r['signal']:10.3e} {r['noise']:10.3e} "
              f"{r['backward_s']:6.2f} {r['ess']:5.2f}", flush=True)


if __name__ == "__main__":
    main()

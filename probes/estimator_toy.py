"""Bias / variance of the MTE estimators on a linear-Gaussian head chain (method.md §3.2).

The numbers of docs/method.md's multi-trajectory estimators; the toy and the measurement
are margrpo/probes/estimator_toy.py (whose docstring describes them).

    .venv/bin/python probes/estimator_toy.py [--n-x0 4000] [--seed 0]
"""
from __future__ import annotations

import argparse

import torch

from margrpo.probes.estimator_toy import LinearGaussianToy, table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-x0", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--theta", type=float, default=0.5)
    ap.add_argument("--s0", type=float, default=0.1)
    ap.add_argument("--kappa", type=float, default=0.3)
    ap.add_argument("--head", choices=("shift", "datamean"), default="shift")
    args = ap.parse_args()
    toy = LinearGaussianToy(args.theta, args.s0, args.kappa, args.head)
    mu, var = toy.marginal(torch.tensor(args.theta, dtype=torch.float64))
    print(f"toy: T={toy.num_steps} DDPM posterior variance, head={args.head}, theta={args.theta}, s0={args.s0}, kappa={args.kappa}; "
          f"model x0 ~ N({float(mu):.4f}, {float(var):.4f}); n_x0={args.n_x0}, seed={args.seed}")
    print(f"{'estimator':<10} {'M':>3} {'bias':>9} {'(se)':>8} {'rms_bias':>9} {'cond_var':>10} {'ESS':>6}")
    rows = table(args.n_x0, args.seed, toy=toy)
    for r in rows:
        print(f"{r['estimator']:<10} {r['M']:>3} {r['bias']:>+9.4f} {r['se']:>8.4f} {r['rms_bias']:>9.4f} "
              f"{r['cond_var']:>10.4f} {r['ess']:>6.2f}")
    print(f"Var of the exact score over x0 ~ p_theta (Fisher information): {rows[0]['score_var']:.4f}")


if __name__ == "__main__":
    main()

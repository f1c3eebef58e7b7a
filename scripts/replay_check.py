"""Replay a few training steps of every method and record every number they produce, so that
a change to the training code can be shown to leave them bitwise the same.

    .venv/bin/python scripts/replay_check.py --out /tmp/after.json
    .venv/bin/python scripts/replay_check.py --compare /tmp/before.json /tmp/after.json

For each method of params.yaml and each --seeds seed, a trainer built by Trainer.from_params
(the committed base model, the params' reward, the prompts make_prompt_set("train", 2,
seed=0)) runs --steps training steps on a small batch: train.prompts_per_step 4 and
train.group_size 4, on the CPU. Every method keeps its own estimator, token scope, top-k,
consistency filter, batch factor and gradient-probe interval (params.yaml probes at step 0,
so probe/* is compared too). The JSON holds every step's metrics dict (time/* dropped: wall
clock) and the SHA-256 of the final parameters of each (method, seed).

--compare compares two such files exactly: a float differs when any bit does (float.hex,
so 0.0 and -0.0 differ too); it prints every difference and exits 1 if there is one.
Both files must come from the same number of threads (--threads, default 1): a CPU
reduction splits its work by thread count, which changes its rounding.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

SMALL = {"train.prompts_per_step": 4, "train.group_size": 4, "runtime.device": "cpu"}


def params_sha256(policy) -> str:
    """SHA-256 over every parameter's name, dtype, shape and bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(policy.named_parameters()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def record(args) -> None:
    import torch

    import margrpo
    from margrpo.config import load_params
    from margrpo.training.trainer import Trainer
    from margrpo.world.prompts import make_prompt_set

    torch.set_num_threads(args.threads)
    params = load_params(args.params, SMALL)
    prompts = make_prompt_set("train", 2, seed=0)
    methods = args.methods or list(params.methods)
    out = {"meta": {"margrpo": str(Path(margrpo.__file__).resolve().parent), "torch": torch.__version__,
                    "threads": args.threads, "steps": args.steps, "seeds": args.seeds, "overrides": SMALL,
                    "params": str(Path(args.params).resolve())},
           "runs": {}}
    for method in methods:
        for seed in args.seeds:
            t0 = time.time()
            tr = Trainer.from_params(params, method, seed, prompts)
            steps = []
            for _ in range(args.steps):
                metrics = tr.train_step()
                steps.append({k: v for k, v in sorted(metrics.items()) if not k.startswith("time/")})
            out["runs"][f"{method}/seed{seed}"] = {"steps": steps, "params_sha256": params_sha256(tr.policy)}
            print(f"{method} seed {seed}: {args.steps} steps, {len(steps[0])} metrics per step, "
                  f"{time.time() - t0:.1f} s", flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1, allow_nan=True) + "\n")
    print(f"wrote {args.out} (code from {out['meta']['margrpo']})")


def _key(v):
    """What must match exactly: a float's bits (float.hex), anything else as it is."""
    return v.hex() if isinstance(v, float) and not math.isnan(v) else ("nan" if isinstance(v, float) else v)


def compare(path_a: str, path_b: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    for k in ("threads", "steps", "seeds", "overrides"):
        if a["meta"].get(k) != b["meta"].get(k):
            print(f"meta {k} differs: {a['meta'].get(k)} vs {b['meta'].get(k)}")
    diffs, values = [], 0
    for run in sorted(set(a["runs"]) | set(b["runs"])):
        if run not in a["runs"] or run not in b["runs"]:
            diffs.append(f"{run}: only in {path_a if run in a['runs'] else path_b}")
            continue
        ra, rb = a["runs"][run], b["runs"][run]
        if ra["params_sha256"] != rb["params_sha256"]:
            diffs.append(f"{run}: final parameters differ (sha256 {ra['params_sha256'][:12]} vs "
                         f"{rb['params_sha256'][:12]})")
        if len(ra["steps"]) != len(rb["steps"]):
            diffs.append(f"{run}: {len(ra['steps'])} vs {len(rb['steps'])} steps")
        for i, (ma, mb) in enumerate(zip(ra["steps"], rb["steps"]), start=1):
            for k in sorted(set(ma) | set(mb)):
                values += 1
                if k not in ma or k not in mb:
                    diffs.append(f"{run} step {i} {k}: only in {path_a if k in ma else path_b}")
                elif _key(ma[k]) != _key(mb[k]):
                    diffs.append(f"{run} step {i} {k}: {ma[k]!r} vs {mb[k]!r}")
    runs = sorted(set(a["runs"]) & set(b["runs"]))
    probes = sum(1 for r in runs for s in a["runs"][r]["steps"] for k in s if k.startswith("probe/"))
    print(f"compared {len(runs)} runs ({', '.join(runs)}), {values} metric values ({probes} probe/*), "
          f"{len(runs)} parameter hashes")
    for d in diffs:
        print("DIFF", d)
    print("identical" if not diffs else f"{len(diffs)} differences")
    return 1 if diffs else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two recorded files")
    ap.add_argument("--out", default="replay.json")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--methods", nargs="*", default=None, help="default: every method of the params")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    record(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

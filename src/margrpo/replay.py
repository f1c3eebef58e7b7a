"""Replay a few training steps and record every number they produce, so that a change to the
training code can be shown to leave them bitwise the same (scripts/replay_check.py is the
command; tests/test_replay.py compares one method with a committed reference).

For each method and seed, a trainer built by Trainer.from_params (the params' base model and
reward, the prompts make_prompt_set("train", 2, seed=0)) runs `steps` training steps
(training.loop.train_step) on a small batch: train.prompts_per_step 4 and train.group_size 4,
on the CPU. Every method keeps its own estimator, token scope, top-k, consistency filter,
batch factor and gradient-probe interval (params.yaml probes at step 0, so probe/* is
compared too). A record holds every step's metrics dict (time/* dropped: wall clock) and the
SHA-256 of the final parameters of each (method, seed).

Two records compare exactly: a float differs when any bit does (float.hex, so 0.0 and -0.0
differ too). Both must come from the same number of threads: a CPU reduction splits its work
by thread count, which changes its rounding. Another CPU model rounds differently too (its
BLAS kernels pick other instruction paths; measured: relative differences of 4e-7 to 1.4e-5
after two steps), so across machines `differences(..., rtol=...)` compares floats to a
relative tolerance and leaves the parameter hash out.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

SMALL = {"train.prompts_per_step": 4, "train.group_size": 4, "runtime.device": "cpu"}
META_KEYS = ("threads", "steps", "seeds", "overrides")  # what must agree for a comparison to mean anything


def params_sha256(policy) -> str:
    """SHA-256 over every parameter's name, dtype, shape and bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(policy.named_parameters()):
        t = p.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def record(params_path: str | Path, methods: list[str] | None = None, seeds: list[int] = (0, 1), steps: int = 3,
           threads: int = 1, log=print) -> dict:
    """The record of `steps` steps of each method (default: every method of the params) and
    seed, with `threads` torch CPU threads (restored afterwards)."""
    import torch

    import margrpo
    from margrpo.config import load_params
    from margrpo.training.loop import train_step
    from margrpo.training.trainer import Trainer
    from margrpo.world.prompts import make_prompt_set

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        params = load_params(params_path, SMALL)
        prompts = make_prompt_set("train", 2, seed=0)
        code = Path(margrpo.__file__).resolve().parent
        code = code.relative_to(Path.cwd()) if code.is_relative_to(Path.cwd()) else code
        out = {"meta": {"margrpo": str(code), "torch": torch.__version__,
                        "threads": threads, "steps": steps, "seeds": list(seeds), "overrides": SMALL,
                        "params": str(params_path)},
               "runs": {}}
        for method in methods or list(params.methods):
            for seed in seeds:
                t0 = time.time()
                tr = Trainer.from_params(params, method, seed, prompts)
                rows = []
                for _ in range(steps):
                    metrics, _ = train_step(tr)
                    rows.append({k: v for k, v in sorted(metrics.items()) if not k.startswith("time/")})
                out["runs"][f"{method}/seed{seed}"] = {"steps": rows, "params_sha256": params_sha256(tr.policy)}
                log(f"{method} seed {seed}: {steps} steps, {len(rows[0]) if rows else 0} metrics per step, "
                    f"{time.time() - t0:.1f} s")
    finally:
        torch.set_num_threads(before)
    # as it reads back from its file (JSON numbers, lists), so a fresh record compares like a saved one
    return json.loads(dumps(out))


def dumps(rec: dict) -> str:
    return json.dumps(rec, indent=1, allow_nan=True) + "\n"


def _key(v):
    """What must match exactly: a float's bits (float.hex), anything else as it is."""
    return v.hex() if isinstance(v, float) and not math.isnan(v) else ("nan" if isinstance(v, float) else v)


def _same(x, y, rtol: float) -> bool:
    if rtol and isinstance(x, float) and isinstance(y, float):
        return math.isclose(x, y, rel_tol=rtol, abs_tol=1e-12) or (math.isnan(x) and math.isnan(y))
    return _key(x) == _key(y)


def differences(a: dict, b: dict, name_a: str = "A", name_b: str = "B", rtol: float = 0.0) -> tuple[list[str], str]:
    """(every difference between two records, a summary line of what was compared). rtol 0:
    bit for bit, parameter hashes included; rtol > 0: floats within that relative tolerance,
    parameter hashes not compared (records from two CPU models)."""
    diffs = [f"meta {k} differs: {a['meta'].get(k)} vs {b['meta'].get(k)}"
             for k in META_KEYS if a["meta"].get(k) != b["meta"].get(k)]
    values = 0
    for run in sorted(set(a["runs"]) | set(b["runs"])):
        if run not in a["runs"] or run not in b["runs"]:
            diffs.append(f"{run}: only in {name_a if run in a['runs'] else name_b}")
            continue
        ra, rb = a["runs"][run], b["runs"][run]
        if not rtol and ra["params_sha256"] != rb["params_sha256"]:
            diffs.append(f"{run}: final parameters differ (sha256 {ra['params_sha256'][:12]} vs "
                         f"{rb['params_sha256'][:12]})")
        if len(ra["steps"]) != len(rb["steps"]):
            diffs.append(f"{run}: {len(ra['steps'])} vs {len(rb['steps'])} steps")
        for i, (ma, mb) in enumerate(zip(ra["steps"], rb["steps"]), start=1):
            for k in sorted(set(ma) | set(mb)):
                values += 1
                if k not in ma or k not in mb:
                    diffs.append(f"{run} step {i} {k}: only in {name_a if k in ma else name_b}")
                elif not _same(ma[k], mb[k], rtol):
                    diffs.append(f"{run} step {i} {k}: {ma[k]!r} vs {mb[k]!r}")
    runs = sorted(set(a["runs"]) & set(b["runs"]))
    probes = sum(1 for r in runs for s in a["runs"][r]["steps"] for k in s if k.startswith("probe/"))
    summary = (f"compared {len(runs)} runs ({', '.join(runs)}), {values} metric values ({probes} probe/*), "
               + (f"to a relative {rtol:g}" if rtol else f"{len(runs)} parameter hashes"))
    return diffs, summary


def compare(path_a: str | Path, path_b: str | Path) -> int:
    """Print every difference between two recorded files; 1 if there is one."""
    a, b = (json.loads(Path(p).read_text()) for p in (path_a, path_b))
    diffs, summary = differences(a, b, str(path_a), str(path_b))
    print(summary)
    for d in diffs:
        print("DIFF", d)
    print("identical" if not diffs else f"{len(diffs)} differences")
    return 1 if diffs else 0

"""The ablation grid and the long run as DVC experiments: queue them, run them one at a time,
and commit each finished experiment's results to reports/ablation/<experiment>.json.

    python scripts/ablation.py                 # queue what is missing, run the queue, collect as they finish
    python scripts/ablation.py --dry           # the plan: experiments, what each retrains, estimated minutes
    python scripts/ablation.py --arms k,tau    # a subset of the arms (k, M, tau, long)
    python scripts/ablation.py status          # each experiment: collected / finished / queued / running / failed
    python scripts/ablation.py collect         # collect the finished experiments now (no queueing)

Each experiment is `dvc exp run --queue -n <name> --allow-missing -S <key>=<value> ...`
(report/ablation.py `grid`; the long run on seed 0 unless --long-seeds says otherwise).
--allow-missing: a model missing only from the DVC cache does not retrain a method whose
params did not change. The queue runs one experiment at a time (`dvc queue start -j 1`).
Rerunning resumes: a collected experiment is skipped, a finished one collected, a queued or
running one left to the queue, a failed or killed one queued again, its training resuming
from its checkpoints (outputs/ckpt of the main repository). Ctrl-C stops the waiting, not
the queue (`dvc queue kill <name>`, `dvc queue stop`).

A record holds the experiment's params, its summary.json and, per retrained method, the
final checkpoints' per-prompt test scores, the per-step training history and the held-out
evaluations (report/ablation.py); the study the experiment started from is recorded once
as centre-<code>.json. Each collected experiment is also a row of MLflow's study view
(?viewStateShareKey=studies): its own stages logged it there; a store without it (a fresh
clone) gets the row from the record, tagged margrpo.ablation = <arm>.

The queue's states, what a point retrains and the collection are margrpo/experiments.py;
this command adds the time estimate (pipeline/validate.py) and the waiting.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the pipeline package (not installed) for the time estimate

from margrpo.experiments import ARMS, LONG_SEEDS, Experiments, action, parse_queue, pending, retrains, with_seeds  # noqa: E402
from margrpo.paramfile import parse_overrides  # noqa: E402
from margrpo.report.ablation import Point, grid, roles  # noqa: E402


def estimate(point: Point, methods: list[str], raw: dict) -> tuple[float | None, str]:
    """Minutes on 2 cores (training, evaluation, stage start-ups, report) from the committed
    study's measured step and evaluation times (pipeline/validate.py estimate_minutes), and
    a note on the proxies used: a method without a record of its own is timed as the other
    estimator's method; speculative tokens scale a method by the measured ratio of the
    study's speculative and committed-only frozen-head methods."""
    from margrpo.config import load_params
    from pipeline import validate

    params = load_params(ROOT / "params.yaml", parse_overrides(point.overrides))
    keys, r = parse_overrides(point.overrides), roles(raw)

    def minutes_of(m: str | None, p=params) -> float | None:
        if m is None or not (ROOT / "reports" / "train" / m / "metrics.json").exists():
            return None
        return validate.estimate_minutes(p, [m]) - validate.STAGE_START_S / 60  # the report's start-up: once

    study = load_params(ROOT / "params.yaml")
    spec = next((m for m, c in raw["methods"].items() if c.get("token_scope") == "committed+speculative"
                 and c.get("estimator", "single") == "single"), None)
    a, b = minutes_of(spec, study), minutes_of(r.get("grpo_frozen"), study)
    spec_ratio = a / b if a and b else None
    total, notes = validate.STAGE_START_S / 60, []
    for m in methods:
        timed = m if minutes_of(m) is not None else next((r[e] for e in ("resample", "posterior")
                                                          if minutes_of(r.get(e)) is not None), None)
        minutes = minutes_of(timed)
        if minutes is None:
            return None, f"no measured step times for {m}"
        if timed != m:
            notes.append(f"{m} timed as {timed}")
        if f"methods.{m}.token_scope" in keys and spec_ratio:
            minutes *= spec_ratio
            notes.append(f"{m} x{spec_ratio:.2f} for speculative tokens")
        total += minutes
    return total, "; ".join(notes)


def plan(points: list[Point], raw: dict, lock: dict) -> list[tuple[Point, list[str], float | None, str]]:
    """Per point: the methods it retrains (dvc.lock), its estimated minutes and a note. A
    point whose keys change none of its methods is the study itself and is left out."""
    out = []
    for p in points:
        methods = retrains(p, lock, list(raw["methods"]))
        absent = sorted(set(p.methods.values()) - set(methods))
        if absent and len(absent) == len(p.methods):
            print(f"ablation: {p.name} is the study itself (its keys hold these values in dvc.lock): nothing to run")
            continue
        if absent:
            raise SystemExit(f"ablation: {p.name} would not retrain {', '.join(absent)}: their train@ params in "
                             f"dvc.lock do not list {', '.join(parse_overrides(p.overrides))}, or hold these values; commit the "
                             "study (dvc repro) with every method of the grid reading the ablation keys, then queue")
        minutes, note = estimate(p, methods, raw)
        out.append((p, methods, minutes, note))
    return out


def main(argv: list[str] | None = None) -> None:
    from margrpo.report.ablation import read_records

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="run", choices=("run", "status", "collect"))
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    ap.add_argument("--long-seeds", default=",".join(map(str, LONG_SEEDS)),
                    help="comma-separated seeds of the long run (the study's train.seeds: 0,1,2)")
    ap.add_argument("--dry", action="store_true", help="print the plan and the estimate; queue nothing")
    ap.add_argument("--no-wait", action="store_true", help="queue and start, then return")
    ap.add_argument("--poll", type=float, default=60.0, help="seconds between checks while waiting")
    a = ap.parse_args(argv)
    os.chdir(ROOT)  # DVC, git and the time estimate's relative paths
    exp = Experiments(ROOT)
    arms = a.arms.split(",")
    if bad := sorted(set(arms) - set(ARMS)):
        raise SystemExit(f"ablation: unknown arm {', '.join(bad)}; choose from {', '.join(ARMS)}")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    try:
        long_seeds = [int(x) for x in a.long_seeds.split(",")]
        points = [with_seeds(p, long_seeds, raw) for p in grid(raw) if p.arm in arms]
    except ValueError as err:
        raise SystemExit(f"ablation: {err}") from None
    if a.command == "collect":
        exp.collect_finished(points)
        print(f"ablation: {exp.mlflow_rows(read_records(exp.records))} MLflow study row(s) added")
        return
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())
    rows = plan(points, raw, lock)
    points = [p for p, _, _, _ in rows]
    queue, workers = parse_queue(exp.dvc("queue", "status"))
    finished, collected = exp.finished(), exp.collected_names()
    todo = 0.0
    for p, methods, minutes, note in rows:
        act = action(p.name, collected, finished, queue)
        if act in ("queue", "wait"):
            todo += minutes or 0.0
        state = f"{act} ({', '.join(sorted(queue[p.name])).lower()})" if p.name in queue and act != "skip" else act
        cost = f"~{minutes:.0f} min" if minutes is not None else "time unknown"
        print(f"{p.name:14s} {state:18s} retrains {', '.join(methods)}; {cost}{f' ({note})' if note else ''}; "
              f"-S {' -S '.join(p.overrides)}")
    print(f"ablation: {len(rows)} experiments, ~{sum(m or 0 for _, _, m, _ in rows) / 60:.1f} h on 2 cores in all, "
          f"~{todo / 60:.1f} h still to run")
    if a.command == "status" or a.dry:
        return
    exp.collect_finished(points)
    for p, _, _, _ in rows:
        if action(p.name, exp.collected_names(), exp.finished(), queue) == "queue":
            exp.dvc("exp", "run", "--queue", "-n", p.name, "--allow-missing", *[x for o in p.overrides for x in ("-S", o)])
            print(f"ablation: queued {p.name}", flush=True)
    queue, workers = parse_queue(exp.dvc("queue", "status"))
    if workers == 0 and any("Queued" in queue.get(p.name, set()) for p in points):
        # The worker it starts outlives it and would hold a captured pipe open: no capture.
        if subprocess.run(["dvc", "queue", "start", "-j", "1"], cwd=ROOT, stdout=subprocess.DEVNULL,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"}).returncode:
            raise SystemExit("ablation: dvc queue start failed (dvc queue status)")
    if a.no_wait:
        return
    try:
        while any(pending(p.name, queue) for p in points):
            time.sleep(a.poll)
            exp.collect_finished(points)
            queue, _ = parse_queue(exp.dvc("queue", "status"))
    except KeyboardInterrupt:
        print("\nablation: stopped waiting; the queue keeps running (dvc queue status). Rerun to collect.")
        return
    exp.collect_finished(points)
    print(f"ablation: {exp.mlflow_rows(read_records(exp.records))} MLflow study row(s) added. Commit reports/ablation/ and "
          "rebuild the report: git add reports/ablation && dvc repro report")
    failed = [p.name for p in points if "Failed" in queue.get(p.name, set()) and p.name not in exp.collected_names()]
    if failed:
        print(f"ablation: failed: {', '.join(failed)} (dvc queue logs <name>); rerun this command to queue them again")


if __name__ == "__main__":
    main()

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
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the pipeline package (not installed) for the time estimate

from margrpo.atomic import write_text  # noqa: E402
from margrpo.paramfile import get, parse_overrides  # noqa: E402
from margrpo.report.ablation import HISTORY_KEYS, SPECULATIVE, Point, grid, roles  # noqa: E402

RECORDS = ROOT / "reports" / "ablation"
ARMS = ("k", "M", "tau", "long")
EXP_REF = re.compile(r"^refs/exps/([0-9a-f]{2})/([0-9a-f]{38})/([^/]+)$")
# params the grid sets; left out of the code fingerprint so the centre and its points share it
GRID_TOP_KEYS, GRID_METHOD_KEYS = ("k", "tau", "num_trajectories"), (*SPECULATIVE, "steps_factor", "reads")
LONG_SEEDS = (0,)  # the long run's: one seed keeps its 10x horizon near 2.2 h on two cores
SCORE_KINDS = ("geneval", "t2i")


def git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if check and proc.returncode:
        raise SystemExit(f"ablation: git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def show(commit: str, path: str) -> str | None:
    proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def dvc(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["dvc", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    if check and proc.returncode:
        raise SystemExit(f"ablation: dvc {' '.join(args)} failed:\n{(proc.stdout + proc.stderr).strip()}")
    return proc.stdout + proc.stderr


# ---- state of each experiment ----------------------------------------------------------

def finished_experiments() -> dict[str, tuple[str, str]]:
    """name -> (commit, baseline) of the newest DVC experiment of that name, any baseline."""
    out: dict[str, tuple[int, str, str]] = {}
    for line in git("for-each-ref", "--format=%(refname) %(objectname) %(committerdate:unix)", "refs/exps").split("\n"):
        ref, _, rest = line.partition(" ")
        m = EXP_REF.match(ref)
        if m:
            sha, when = rest.split()
            if m.group(3) not in out or int(when) > out[m.group(3)][0]:
                out[m.group(3)] = (int(when), sha, m.group(1) + m.group(2))
    return {name: (sha, base) for name, (_, sha, base) in out.items()}


def parse_queue(text: str) -> tuple[dict[str, set[str]], int]:
    """`dvc queue status` -> ({name: the statuses of its entries}, workers, active or idle).
    A name may have several entries (a failed run queued again)."""
    states: dict[str, set[str]] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and re.fullmatch(r"[0-9a-f]{7,}", parts[0]):
            states.setdefault(parts[1], set()).add(parts[-1])
    m = re.search(r"Worker status:\s*(\d+) active, (\d+) idle", text)
    return states, int(m.group(1)) + int(m.group(2)) if m else 0


def pending(name: str, queue: dict[str, set[str]]) -> bool:
    return bool(queue.get(name, set()) & {"Queued", "Running"})


def action(name: str, collected: set[str], finished: dict, queue: dict[str, set[str]]) -> str:
    """What the command does with one experiment: skip (collected), collect (finished, no
    record yet), wait (queued or running), queue (never run, failed or killed)."""
    if name in collected:
        return "skip"
    if name in finished:
        return "collect"
    if pending(name, queue):
        return "wait"
    return "queue"


def collected_names() -> set[str]:
    return {p.stem for p in RECORDS.glob("*.json")} if RECORDS.is_dir() else set()


# ---- what a point retrains and costs -----------------------------------------------------

def changes(locked: dict, key: str, value) -> bool:
    """Whether setting `key` to `value` changes a stage's locked params (dvc.lock): the key,
    or a section above it, is listed and holds another value there."""
    for p, held in locked.items():
        if key == p:
            return held != value
        if key.startswith(p + "."):
            return get(held, key[len(p) + 1:]) != value
    return False


def retrains(point: Point, lock: dict, methods: list[str]) -> list[str]:
    """The methods whose train stage the point's keys change (dvc.lock's params)."""
    overrides = parse_overrides(point.overrides)
    out = []
    for m in methods:
        locked = lock.get("stages", {}).get(f"train@{m}", {}).get("params", {}).get("params.yaml", {})
        if any(changes(locked, k, v) for k, v in overrides.items()):
            out.append(m)
    return out


def estimate(point: Point, methods: list[str], raw: dict) -> tuple[float | None, str]:
    """Minutes on 2 cores (training, evaluation, stage start-ups, report) from the committed
    study's measured step and evaluation times (pipeline/validate.py estimate_minutes), and
    a note on the proxies used: a method without a record of its own is timed as the other
    estimator's method; speculative tokens scale a method by the measured ratio of the
    study's speculative and committed-only frozen-head methods."""
    from margrpo.config import load_params
    from pipeline import validate

    params = load_params(ROOT / "params.yaml", parse_overrides(point.overrides))
    keys, r = parse_overrides(point.overrides), roles(raw["methods"])

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


def with_seeds(point: Point, seeds: list[int], raw: dict) -> Point:
    """The long run on `seeds` (an override only where they differ from the study's)."""
    if point.arm != "long" or list(seeds) == list(raw["train"]["seeds"]):
        return point
    return replace(point, overrides=(*point.overrides, f"train.seeds=[{','.join(map(str, seeds))}]"))


# ---- records ------------------------------------------------------------------------------

def fingerprint(commit: str) -> str:
    """What the train and evaluate stages of `commit` read, but the grid's keys: the git
    objects of their code and data deps (dvc.yaml) and params.yaml without the grid keys."""
    raw = yaml.safe_load(show(commit, "params.yaml") or "{}")
    stages = yaml.safe_load(show(commit, "dvc.yaml") or "{}").get("stages", {})
    paths = set()
    for stage in ("train", "evaluate"):
        for dep in stages.get(stage, {}).get("do", {}).get("deps", []):
            dep = dep.replace("${model.checkpoint}", str(get(raw, "model.checkpoint", "models/base")))
            if "${" not in dep and not dep.startswith("reports/"):
                paths.add(dep)
    objects = {p: git("rev-parse", f"{commit}:{p}", check=False).strip() or "-" for p in sorted(paths)}
    params = {k: v for k, v in raw.items() if k not in GRID_TOP_KEYS}
    # the long run sets its own seeds (records keep them under knobs.seeds; pairs match seeds)
    params["train"] = {k: v for k, v in (raw.get("train") or {}).items() if k != "seeds"}
    params["methods"] = {m: {k: v for k, v in (c or {}).items() if k not in GRID_METHOD_KEYS}
                         for m, c in (raw.get("methods") or {}).items()}
    return hashlib.sha256(json.dumps([objects, params], sort_keys=True).encode()).hexdigest()[:12]


def _jsonl(text: str | None) -> list[dict]:
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


def method_entry(commit: str, method: str, raw: dict, role: str | None) -> dict:
    """One method's part of a record, read from the experiment's commit."""
    pp = json.loads(show(commit, f"reports/eval/{method}/per_prompt.json") or "null")
    if pp is not None:
        pp = {"prompts": pp["prompts"], "images_per_prompt": pp.get("images_per_prompt"),
              "final": {s: {k: v[k] for k in SCORE_KINDS if k in v} for s, v in pp["final"].items()}}
    seeds_dir = f"reports/train/{method}/seeds"
    history, evals, minutes = {}, {}, []
    for path in sorted(git("ls-tree", "-r", "--name-only", commit, seeds_dir).split()):
        seed = path.split("/")[-2].removeprefix("seed")
        if path.endswith("history.jsonl"):
            rows = _jsonl(show(commit, path))
            history[seed] = [{k: r[k] for k in ("step", *HISTORY_KEYS) if k in r} for r in rows]
            minutes.append(sum(r.get("time/step", 0.0) for r in rows) / 60)
        elif path.endswith("evals.jsonl"):
            evals[seed] = _jsonl(show(commit, path))
    config = raw["methods"][method]
    return {"role": role, "config": config, "steps": int(raw["train"]["steps"]) * int(config.get("steps_factor", 1)),
            "per_prompt": pp, "train_minutes": minutes, "history": history, "evals": evals}


def record(name: str, arm: str, commit: str, baseline: str, overrides: list[str], methods: list[str],
           role_of: dict[str, str]) -> dict:
    from margrpo.tracking.runs import params_hash

    text = show(commit, "params.yaml")
    raw = yaml.safe_load(text)
    return {
        "name": name, "arm": arm, "commit": commit, "baseline": baseline, "code": fingerprint(commit),
        # the MLflow study id the experiment's own stages used (margrpo.tracking.runs.study_id)
        "study": f"{baseline[:10]}-{name}-{params_hash(text)}", "overrides": overrides,
        "knobs": {"k": raw["k"], "tau": raw["tau"], "num_trajectories": raw["num_trajectories"],
                  "seeds": raw["train"]["seeds"]},
        "params": raw, "summary": json.loads(show(commit, "reports/summary.json") or "{}"),
        "methods": {m: method_entry(commit, m, raw, role_of.get(m)) for m in methods},
        "collected": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def write(rec: dict, path: Path) -> None:
    write_text(json.dumps(rec, sort_keys=True) + "\n", path)


def collect(point: Point, commit: str, baseline: str) -> Path:
    """reports/ablation/<name>.json for a finished experiment, and the centre record of the
    study it started from (when not yet written)."""
    raw = yaml.safe_load(show(commit, "params.yaml"))
    role_of = {m: role for role, m in roles(yaml.safe_load(show(baseline, "params.yaml"))["methods"]).items()}
    ran = [m for m in raw["methods"] if show(commit, f"reports/train/{m}/trained.json")
           != show(baseline, f"reports/train/{m}/trained.json")]
    missing = sorted(set(point.methods.values()) - set(ran))
    if missing:
        print(f"ablation: {point.name} did not retrain {', '.join(missing)} (dvc queue logs {point.name})")
    rec = record(point.name, point.arm, commit, baseline, list(point.overrides), ran, role_of)
    write(rec, RECORDS / f"{point.name}.json")
    centre = RECORDS / f"centre-{rec['code']}.json"
    if not centre.exists():
        if fingerprint(baseline) != rec["code"]:
            print(f"ablation: {point.name} ran with inputs its baseline commit {baseline[:10]} lacks (queued from a "
                  "workspace with uncommitted changes?): no centre to compare it with; commit, then queue again")
        else:
            base_raw = yaml.safe_load(show(baseline, "params.yaml"))
            scored = [m for m in base_raw["methods"] if show(baseline, f"reports/eval/{m}/per_prompt.json")]
            write(record(f"centre-{rec['code']}", "centre", baseline, baseline, [], scored, role_of), centre)
    return RECORDS / f"{point.name}.json"


def mlflow_rows(records: list[dict]) -> int:
    """Give every experiment record a parent run in MLflow's study view (tracking/rebuild.py)."""
    from margrpo.tracking.rebuild import ablation_rows

    return ablation_rows(records, ROOT)


# ---- the command ----------------------------------------------------------------------------

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


def collect_finished(points: list[Point]) -> list[str]:
    done = []
    finished = finished_experiments()
    for p in points:
        if p.name in finished and p.name not in collected_names():
            commit, baseline = finished[p.name]
            print(f"ablation: collected {collect(p, commit, baseline).relative_to(ROOT)}", flush=True)
            done.append(p.name)
    return done


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
    arms = a.arms.split(",")
    if bad := sorted(set(arms) - set(ARMS)):
        raise SystemExit(f"ablation: unknown arm {', '.join(bad)}; choose from {', '.join(ARMS)}")
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    try:
        long_seeds = [int(x) for x in a.long_seeds.split(",")]
        points = [with_seeds(p, long_seeds, raw) for p in grid(raw["methods"]) if p.arm in arms]
    except ValueError as err:
        raise SystemExit(f"ablation: {err}") from None
    if a.command == "collect":
        collect_finished(points)
        print(f"ablation: {mlflow_rows(read_records(RECORDS))} MLflow study row(s) added")
        return
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())
    rows = plan(points, raw, lock)
    points = [p for p, _, _, _ in rows]
    queue, workers = parse_queue(dvc("queue", "status"))
    finished, collected = finished_experiments(), collected_names()
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
    collect_finished(points)
    for p, _, _, _ in rows:
        if action(p.name, collected_names(), finished_experiments(), queue) == "queue":
            dvc("exp", "run", "--queue", "-n", p.name, "--allow-missing", *[x for o in p.overrides for x in ("-S", o)])
            print(f"ablation: queued {p.name}", flush=True)
    queue, workers = parse_queue(dvc("queue", "status"))
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
            collect_finished(points)
            queue, _ = parse_queue(dvc("queue", "status"))
    except KeyboardInterrupt:
        print("\nablation: stopped waiting; the queue keeps running (dvc queue status). Rerun to collect.")
        return
    collect_finished(points)
    print(f"ablation: {mlflow_rows(read_records(RECORDS))} MLflow study row(s) added. Commit reports/ablation/ and "
          "rebuild the report: git add reports/ablation && dvc repro report")
    failed = [p.name for p in points if "Failed" in queue.get(p.name, set()) and p.name not in collected_names()]
    if failed:
        print(f"ablation: failed: {', '.join(failed)} (dvc queue logs <name>); rerun this command to queue them again")


if __name__ == "__main__":
    main()

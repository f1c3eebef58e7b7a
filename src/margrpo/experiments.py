"""The ablation's DVC experiments: the queue's states, what a point retrains, and the records
collected from finished experiments into reports/ablation/<experiment>.json
(scripts/ablation.py is the command; its docstring says what a record holds).

A record holds the experiment's params, its summary.json and, per retrained method, the
final checkpoints' per-prompt test scores, the per-step training history and the held-out
evaluations (report/ablation.py reads them); the study the experiment started from is
recorded once as centre-<code>.json, <code> being the fingerprint of what its train and
evaluate stages read, but the grid's keys.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import yaml

from margrpo.atomic import write_text
from margrpo.paramfile import get, parse_overrides
from margrpo.report.ablation import HISTORY_KEYS, SPECULATIVE, Point, roles

RECORDS = Path("reports") / "ablation"  # in the checkout
ARMS = ("k", "M", "tau", "long")
EXP_REF = re.compile(r"^refs/exps/([0-9a-f]{2})/([0-9a-f]{38})/([^/]+)$")
# params the grid sets; left out of the code fingerprint so the centre and its points share it
GRID_TOP_KEYS, GRID_METHOD_KEYS = ("k", "tau", "num_trajectories"), (*SPECULATIVE, "steps_factor", "reads")
LONG_SEEDS = (0,)  # the long run's: one seed keeps its 10x horizon near 2.2 h on two cores
SCORE_KINDS = ("geneval", "t2i")


# ---- state of each experiment ----------------------------------------------------------

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


# ---- what a point retrains ---------------------------------------------------------------

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


def with_seeds(point: Point, seeds: list[int], raw: dict) -> Point:
    """The long run on `seeds` (an override only where they differ from the study's)."""
    if point.arm != "long" or list(seeds) == list(raw["train"]["seeds"]):
        return point
    return replace(point, overrides=(*point.overrides, f"train.seeds=[{','.join(map(str, seeds))}]"))


def _jsonl(text: str | None) -> list[dict]:
    return [json.loads(line) for line in (text or "").splitlines() if line.strip()]


def write(rec: dict, path: Path) -> None:
    write_text(json.dumps(rec, sort_keys=True) + "\n", path)


# ---- a checkout's experiments and records ---------------------------------------------------

class Experiments:
    """The DVC experiments of the git checkout at `root` (the git and dvc commands run there)
    and its records, root/reports/ablation."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.records = self.root / RECORDS

    def git(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["git", *args], cwd=self.root, capture_output=True, text=True)
        if check and proc.returncode:
            raise SystemExit(f"ablation: git {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def show(self, commit: str, path: str) -> str | None:
        proc = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=self.root, capture_output=True, text=True)
        return proc.stdout if proc.returncode == 0 else None

    def dvc(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(["dvc", *args], cwd=self.root, capture_output=True, text=True,
                              env={**os.environ, "DVC_NO_ANALYTICS": "1"})
        if check and proc.returncode:
            raise SystemExit(f"ablation: dvc {' '.join(args)} failed:\n{(proc.stdout + proc.stderr).strip()}")
        return proc.stdout + proc.stderr

    def finished(self) -> dict[str, tuple[str, str]]:
        """name -> (commit, baseline) of the newest DVC experiment of that name, any baseline."""
        out: dict[str, tuple[int, str, str]] = {}
        for line in self.git("for-each-ref", "--format=%(refname) %(objectname) %(committerdate:unix)", "refs/exps").split("\n"):
            ref, _, rest = line.partition(" ")
            m = EXP_REF.match(ref)
            if m:
                sha, when = rest.split()
                if m.group(3) not in out or int(when) > out[m.group(3)][0]:
                    out[m.group(3)] = (int(when), sha, m.group(1) + m.group(2))
        return {name: (sha, base) for name, (_, sha, base) in out.items()}

    def collected_names(self) -> set[str]:
        return {p.stem for p in self.records.glob("*.json")} if self.records.is_dir() else set()

    def fingerprint(self, commit: str) -> str:
        """What the train and evaluate stages of `commit` read, but the grid's keys: the git
        objects of their code and data deps (dvc.yaml) and params.yaml without the grid keys."""
        raw = yaml.safe_load(self.show(commit, "params.yaml") or "{}")
        stages = yaml.safe_load(self.show(commit, "dvc.yaml") or "{}").get("stages", {})
        paths = set()
        for stage in ("train", "evaluate"):
            for dep in stages.get(stage, {}).get("do", {}).get("deps", []):
                dep = dep.replace("${model.checkpoint}", str(get(raw, "model.checkpoint", "models/base")))
                if "${" not in dep and not dep.startswith("reports/"):
                    paths.add(dep)
        objects = {p: self.git("rev-parse", f"{commit}:{p}", check=False).strip() or "-" for p in sorted(paths)}
        params = {k: v for k, v in raw.items() if k not in GRID_TOP_KEYS}
        # the long run sets its own seeds (records keep them under knobs.seeds; pairs match seeds)
        params["train"] = {k: v for k, v in (raw.get("train") or {}).items() if k != "seeds"}
        params["methods"] = {m: {k: v for k, v in (c or {}).items() if k not in GRID_METHOD_KEYS}
                             for m, c in (raw.get("methods") or {}).items()}
        return hashlib.sha256(json.dumps([objects, params], sort_keys=True).encode()).hexdigest()[:12]

    def method_entry(self, commit: str, method: str, raw: dict, role: str | None) -> dict:
        """One method's part of a record, read from the experiment's commit."""
        pp = json.loads(self.show(commit, f"reports/eval/{method}/per_prompt.json") or "null")
        if pp is not None:
            pp = {"prompts": pp["prompts"], "images_per_prompt": pp.get("images_per_prompt"),
                  "final": {s: {k: v[k] for k in SCORE_KINDS if k in v} for s, v in pp["final"].items()}}
        seeds_dir = f"reports/train/{method}/seeds"
        history, evals, minutes = {}, {}, []
        for path in sorted(self.git("ls-tree", "-r", "--name-only", commit, seeds_dir).split()):
            seed = path.split("/")[-2].removeprefix("seed")
            if path.endswith("history.jsonl"):
                rows = _jsonl(self.show(commit, path))
                history[seed] = [{k: r[k] for k in ("step", *HISTORY_KEYS) if k in r} for r in rows]
                minutes.append(sum(r.get("time/step", 0.0) for r in rows) / 60)
            elif path.endswith("evals.jsonl"):
                evals[seed] = _jsonl(self.show(commit, path))
        config = raw["methods"][method]
        return {"role": role, "config": config, "steps": int(raw["train"]["steps"]) * int(config.get("steps_factor", 1)),
                "per_prompt": pp, "train_minutes": minutes, "history": history, "evals": evals}

    def record(self, name: str, arm: str, commit: str, baseline: str, overrides: list[str], methods: list[str],
               role_of: dict[str, str]) -> dict:
        from margrpo.tracking.runs import params_hash

        text = self.show(commit, "params.yaml")
        raw = yaml.safe_load(text)
        return {
            "name": name, "arm": arm, "commit": commit, "baseline": baseline, "code": self.fingerprint(commit),
            # the MLflow study id the experiment's own stages used (margrpo.tracking.runs.study_id)
            "study": f"{baseline[:10]}-{name}-{params_hash(text)}", "overrides": overrides,
            "knobs": {"k": raw["k"], "tau": raw["tau"], "num_trajectories": raw["num_trajectories"],
                      "seeds": raw["train"]["seeds"]},
            "params": raw, "summary": json.loads(self.show(commit, "reports/summary.json") or "{}"),
            "methods": {m: self.method_entry(commit, m, raw, role_of.get(m)) for m in methods},
            "collected": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }

    def collect(self, point: Point, commit: str, baseline: str) -> Path:
        """reports/ablation/<name>.json for a finished experiment, and the centre record of the
        study it started from (when not yet written)."""
        raw = yaml.safe_load(self.show(commit, "params.yaml"))
        role_of = {m: role for role, m in roles(yaml.safe_load(self.show(baseline, "params.yaml"))).items()}
        ran = [m for m in raw["methods"] if self.show(commit, f"reports/train/{m}/trained.json")
               != self.show(baseline, f"reports/train/{m}/trained.json")]
        missing = sorted(set(point.methods.values()) - set(ran))
        if missing:
            print(f"ablation: {point.name} did not retrain {', '.join(missing)} (dvc queue logs {point.name})")
        rec = self.record(point.name, point.arm, commit, baseline, list(point.overrides), ran, role_of)
        write(rec, self.records / f"{point.name}.json")
        centre = self.records / f"centre-{rec['code']}.json"
        if not centre.exists():
            if self.fingerprint(baseline) != rec["code"]:
                print(f"ablation: {point.name} ran with inputs its baseline commit {baseline[:10]} lacks (queued from a "
                      "workspace with uncommitted changes?): no centre to compare it with; commit, then queue again")
            else:
                base_raw = yaml.safe_load(self.show(baseline, "params.yaml"))
                scored = [m for m in base_raw["methods"] if self.show(baseline, f"reports/eval/{m}/per_prompt.json")]
                write(self.record(f"centre-{rec['code']}", "centre", baseline, baseline, [], scored, role_of), centre)
        return self.records / f"{point.name}.json"

    def mlflow_rows(self, records: list[dict]) -> int:
        """Give every experiment record a parent run in MLflow's study view (tracking/rebuild.py)."""
        from margrpo.tracking.rebuild import ablation_rows

        return ablation_rows(records, self.root)

    def collect_finished(self, points: list[Point]) -> list[str]:
        done = []
        finished = self.finished()
        for p in points:
            if p.name in finished and p.name not in self.collected_names():
                commit, baseline = finished[p.name]
                print(f"ablation: collected {self.collect(p, commit, baseline).relative_to(self.root)}", flush=True)
                done.append(p.name)
        return done

"""scripts/ablation.py's machinery (margrpo/experiments.py): collecting finished DVC experiments
into records (in scratch git repositories), the queue's states, what a point retrains, MLflow
rows, the long run's seeds; and the seeds by design (probes/power.py, margrpo/probes/power.py)."""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from margrpo import experiments
from margrpo.experiments import Experiments
from margrpo.probes import power
from margrpo.report import ablation
from margrpo.report.claims import HOLDS
from test_ablation import CLAIMS, GIT, METHODS, PARAMS, ROOT, SEEDS, _record, _scores


def _write(root: Path, rel: str, obj) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def _git(root: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=root, check=True, capture_output=True, text=True).stdout.strip()


def _study(root: Path, k: float, mar_shift: float, run: str, code: str = "x = 1\n") -> None:
    """The files a study commit holds that collection reads."""
    import yaml

    _write(root, "params.yaml", yaml.safe_dump({"k": k, "tau": 0.0, "num_trajectories": 4, "methods": METHODS,
                                                "claims": CLAIMS, "train": {"seeds": [0, 1, 2], "steps": 20},
                                                "model": {"checkpoint": "models/base"}}))
    _write(root, "dvc.yaml", yaml.safe_dump({"stages": {
        "train": {"foreach": list(METHODS), "do": {"deps": ["src/margrpo/training", "${model.checkpoint}",
                                                            "reports/validated.txt", "prompts/world_train.jsonl"]}},
        "evaluate": {"foreach": list(METHODS), "do": {"deps": ["${item.input}", "src/margrpo/eval"]}}}}))
    _write(root, "src/margrpo/training/step.py", code)
    _write(root, "src/margrpo/eval/judge.py", "y = 2\n")
    _write(root, "models/base/weights", "w")
    _write(root, "prompts/world_train.jsonl", "{}\n")
    for m in METHODS:
        shift = mar_shift if m == "mar_grpo" else 0.0
        pp = _scores(shift)
        pp["best"] = pp["final"]
        for s in SEEDS:
            pp["final"][s]["proxy_geneval"] = pp["final"][s]["geneval"]
        _write(root, f"reports/eval/{m}/per_prompt.json", pp)
        _write(root, f"reports/train/{m}/trained.json", {"study": run if m == "mar_grpo" else "base-run"})
        for s in SEEDS:
            rows = [{"step": t, "time/step": 6.0, "loss/kl": 0.01, "select/ess": 4.0} for t in (1, 2)]
            _write(root, f"reports/train/{m}/seeds/seed{s}/history.jsonl", "\n".join(map(json.dumps, rows)) + "\n")


def _study_repo(root: Path) -> Path:
    """A git repository whose one commit is the study at k = 0.3."""
    root.mkdir()
    _git(root, "init", "-q")
    _study(root, 0.3, 0.0, "centre-run")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "study")
    return root


def test_collect_writes_records_once_and_the_centre(tmp_path):
    root = _study_repo(tmp_path / "repo")
    baseline = _git(root, "rev-parse", "HEAD")
    # the experiment: k = 0.1 retrained mar_grpo only (DVC commits it on top of its baseline)
    _study(root, 0.1, -0.2, "k01-run")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "exp")
    exp = _git(root, "rev-parse", "HEAD")
    _git(root, "update-ref", f"refs/exps/{baseline[:2]}/{baseline[2:]}/abl-k0.1", exp)
    _git(root, "reset", "-q", "--hard", baseline)

    checkout = Experiments(root)
    points = ablation.grid(PARAMS)
    assert checkout.collect_finished(points) == ["abl-k0.1"]
    rec = json.loads((root / "reports/ablation/abl-k0.1.json").read_text())
    assert rec["commit"] == exp and rec["baseline"] == baseline and rec["knobs"]["k"] == 0.1
    assert list(rec["methods"]) == ["mar_grpo"]  # only what the experiment retrained
    entry = rec["methods"]["mar_grpo"]
    assert entry["role"] == "resample" and entry["train_minutes"] == pytest.approx([0.2] * 3)
    assert set(entry["per_prompt"]["final"]["0"]) == {"geneval"} and "best" not in entry["per_prompt"]
    assert entry["history"]["0"] == [{"step": 1, "time/step": 6.0, "loss/kl": 0.01},
                                     {"step": 2, "time/step": 6.0, "loss/kl": 0.01}]
    # the study it started from: every method, same fingerprint (k is a grid key)
    centre = json.loads((root / f"reports/ablation/centre-{rec['code']}.json").read_text())
    assert centre["arm"] == "centre" and set(centre["methods"]) == set(METHODS) and centre["knobs"]["k"] == 0.3
    # collected once: a second pass skips it and leaves the file alone
    stamp = (root / "reports/ablation/abl-k0.1.json").stat().st_mtime_ns
    assert checkout.collect_finished(points) == []
    assert (root / "reports/ablation/abl-k0.1.json").stat().st_mtime_ns == stamp
    # the records judge the point: k = 0.3 beats k = 0.1 by 0.2 on every prompt (the other
    # part is k = 0, the centre's grpo_frozen)
    parts = {p.text: p for p in ablation.claim4(ablation.read_records(root / "reports/ablation")).parts}
    part = parts["GenEval overall, k=0.3 − k=0.1 (mar_grpo (resample))"]
    assert part.status == HOLDS and part.d == pytest.approx(0.2)
    # code changes change the fingerprint; the grid keys do not
    assert checkout.fingerprint(baseline) == rec["code"]
    _study(root, 0.3, 0.0, "centre-run", code="x = 2\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "code change")
    assert checkout.fingerprint("HEAD") != rec["code"]


def test_queue_actions_and_status_parsing():
    text = ("Task     Name      Created    Status\n25f496a  abl-tau0  10:58 PM   Queued\n"
            "129f653  abl-tau0  10:57 PM   Failed\nd250d9a  abl-k0.1  10:57 PM   Success\n"
            "aa71303  abl-m2    10:58 PM   Running\n\nWorker status: 1 active, 0 idle\n")
    states, workers = experiments.parse_queue(text)
    assert states == {"abl-tau0": {"Queued", "Failed"}, "abl-k0.1": {"Success"}, "abl-m2": {"Running"}}
    assert workers == 1
    finished = {"abl-k0.1": ("e", "b")}
    assert experiments.action("abl-k0.1", {"abl-k0.1"}, finished, states) == "skip"
    assert experiments.action("abl-k0.1", set(), finished, states) == "collect"
    assert experiments.action("abl-tau0", set(), {}, states) == "wait"
    assert experiments.action("abl-m2", set(), {}, states) == "wait"
    assert experiments.action("abl-m8", set(), {}, {"abl-m8": {"Failed"}}) == "queue"  # a failed run is queued again
    assert experiments.action("abl-k1", set(), {}, states) == "queue"


def test_retrains_reads_dvc_lock_values():
    lock = {"stages": {
        "train@mar_grpo": {"params": {"params.yaml": {"k": 0.3, "tau": 0.0, "train": {"steps": 20},
                                                      "methods.mar_grpo": {"estimator": "resample"}}}},
        "train@grpo_frozen_spec": {"params": {"params.yaml": {"tau": 0.0, "methods.grpo_frozen_spec": {}}}},
        "train@grpo": {"params": {"params.yaml": {"methods.grpo": {}, "train": {"steps": 20}}}}}}
    methods = ["grpo", "mar_grpo", "grpo_frozen_spec"]
    point = ablation.Point("abl-k0.1", "k", 0.1, ("k=0.1",))
    assert experiments.retrains(point, lock, methods) == ["mar_grpo"]
    # tau = 0 is the locked value: grpo_frozen_spec does not retrain; the method block change does
    tau0 = ablation.Point("abl-tau0", "tau", 0.0, ("tau=0", "methods.mar_grpo.consistency=true"))
    assert experiments.retrains(tau0, lock, methods) == ["mar_grpo"]
    tau5 = ablation.Point("abl-tau0.5", "tau", 0.5, ("tau=0.5",))
    assert experiments.retrains(tau5, lock, methods) == ["mar_grpo", "grpo_frozen_spec"]
    long = ablation.Point("long", "long", 10, ("methods.grpo.steps_factor=10",))
    assert experiments.retrains(long, lock, methods) == ["grpo"]


def test_mlflow_rows_from_records(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    checkout = Experiments(tmp_path)
    rec = {"name": "abl-k0.1", "arm": "k", "study": "abcdef1234-abl-k0.1-0000aaaa", "baseline": "abcdef1234" * 4,
           "params": {"k": 0.1, "methods": {}}, "summary": {"overall": {"mar_grpo": 0.41}, "seeds": 3}}
    centre = {**rec, "name": "centre-c0", "arm": "centre"}
    assert checkout.mlflow_rows([centre, rec]) == 1
    assert checkout.mlflow_rows([centre, rec]) == 0  # found by its study id, not duplicated
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("margrpo-study").experiment_id],
                              "tags.`margrpo.role` = 'parent'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == "abl-k0.1 @ abcdef1" and run.data.tags["margrpo.ablation"] == "k"
    assert run.data.metrics["overall/mar_grpo"] == pytest.approx(0.41)


# ---- power by design ---------------------------------------------------------------------------

def test_power_uses_the_paired_seed_variance(tmp_path):
    # grpo and grpo_frozen share a large seed effect (+0, +0.1, +0.2): pairing removes it
    a = {"0": 0.00, "1": 0.10, "2": 0.20}
    b = {"0": -0.01, "1": 0.07, "2": 0.20}
    for name, offsets in (("grpo", a), ("grpo_frozen", b)):
        _write(tmp_path, f"reports/eval/{name}/per_prompt.json", _scores(0.0, offsets))
    table, decisive = power.rows(tmp_path / "reports", {"grpo": "grpo", "grpo_frozen": "grpo_frozen"},
                                 [0, 1, 2], 0.03, 0.8)
    (row,) = table
    def var(xs):
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)

    var_d = var([a[s] - b[s] for s in SEEDS])  # of 0.01, 0.03, 0.00
    assert float(row[3]) == pytest.approx(var_d, rel=1e-2)  # printed with 3 digits
    assert float(row[4]) == pytest.approx(var(list(a.values())) + var(list(b.values())), rel=1e-2)
    assert float(row[4]) > 20 * float(row[3])
    assert row[5] == "0"  # the prompts are shared and the difference is the same on each: no prompt part
    # n >= var_seed / (delta / (2 * 1.96))^2
    assert decisive == [max(3, math.ceil(var_d / (0.03 / (2 * 1.959964)) ** 2))]
    assert power.needed(1e-3, 1e-3, 3.92, 0.03, 3) == float("inf")  # the prompt part alone exceeds δ/2


def test_a_queued_experiment_checkpoints_in_the_main_repository(tmp_path):
    """DVC deletes a queued experiment's scratch copy (<repo>/.dvc/tmp/exps/<tmp>) when it
    ends or fails: its checkpoints live in <repo>/outputs/ckpt, so a requeued run resumes."""
    import os
    import sys

    code = ("from margrpo.config import load_params; from pipeline.train import checkpoint_dir; "
            "print(checkpoint_dir(load_params('params.yaml'), 'grpo', 0))")
    out = {}
    for where, root in (("scratch", tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpx1y2"), ("main", None)):
        env = {k: v for k, v in os.environ.items() if k != "DVC_ROOT"} | ({"DVC_ROOT": str(root)} if root else {})
        out[where] = Path(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                                         capture_output=True, text=True).stdout.strip())
    # outputs/ckpt/<method>/<key>/seed0, the same key in both
    assert out["scratch"].parents[1] == tmp_path / "repo" / "outputs" / "ckpt" / "grpo"
    assert out["main"].parents[1] == ROOT / "outputs" / "ckpt" / "grpo"
    assert out["scratch"].relative_to(tmp_path / "repo") == out["main"].relative_to(ROOT)


def test_the_long_run_sets_its_seeds_and_keeps_the_fingerprint(tmp_path):
    """The long run's default seed set differs from the study's: its point adds the override
    (and retrains every method whose train params list the seeds); at the study's seeds it adds
    nothing. The seeds are not part of the code fingerprint, so the long run's record shares
    the centre's."""
    raw = {"methods": METHODS, "train": {"seeds": [0, 1, 2]}}
    long = next(p for p in ablation.grid(PARAMS) if p.arm == "long")
    one = experiments.with_seeds(long, [0], raw)
    assert one.overrides == (*long.overrides, "train.seeds=[0]") and one.methods == long.methods
    assert experiments.with_seeds(long, [0, 1, 2], raw) is long
    k = next(p for p in ablation.grid(PARAMS) if p.arm == "k")
    assert experiments.with_seeds(k, [0], raw) is k
    lock = {"stages": {"train@grpo_frozen_spec": {"params": {"params.yaml": {"train": {"seeds": [0, 1, 2]}}}}}}
    assert experiments.retrains(one, lock, ["grpo_frozen_spec"]) == ["grpo_frozen_spec"]

    import yaml

    checkout = Experiments(_study_repo(tmp_path / "repo"))
    before = checkout.fingerprint("HEAD")
    params = checkout.root / "params.yaml"
    changed = yaml.safe_load(params.read_text())
    changed["train"]["seeds"] = [0]
    params.write_text(yaml.safe_dump(changed))
    _git(checkout.root, "commit", "-qam", "one seed")
    assert checkout.fingerprint("HEAD") == before

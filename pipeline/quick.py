"""The quick study as a temporary DVC experiment: `python -m pipeline.quick`.

Runs params.yaml + params_quick.yaml (one seed, 12 training steps per method, a smaller
evaluation) with `dvc exp run --temp`: DVC copies the repo to .dvc/tmp/exps/, runs every
stage whose inputs differ there, and keeps the result as an experiment (`dvc exp show`,
`dvc plots diff`, `python scripts/exp_table.py`). params.yaml, reports/ and everything else
committed stay as they are. The report is copied out to outputs/quick/<name>/reports/
(report.html opens offline); the MLflow runs land in ./mlflow.db as for any stage.

On a fresh clone every method trains (the trained models are DVC-cached and the repo has
no DVC remote); the first printed line says how long, from the committed study's step times.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from pipeline import profile as profiles
from pipeline import validate

OUT = Path("outputs/quick")


def exp_ref(name: str) -> str | None:
    refs = subprocess.run(["git", "for-each-ref", "--format=%(refname)", "refs/exps"],
                          capture_output=True, text=True, check=True).stdout.split()
    return next((r for r in refs if r.rsplit("/", 1)[-1] == name), None)


def export_reports(ref: str, dest: Path) -> Path:
    """The experiment's reports/ folder (committed in its git commit) into dest/reports."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", ref, "reports"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "reports"


def main(argv: list[str] | None = None) -> None:
    from margrpo.config import ParamsError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=Path("params_quick.yaml"))
    ap.add_argument("--name", default=None, help="experiment name (default: quick-<date>-<time>)")
    ap.add_argument("--dry", action="store_true", help="show what would run (dvc exp run --dry)")
    args = ap.parse_args(argv)
    name = args.name or time.strftime("quick-%y%m%d-%H%M%S")
    try:
        profile, params = profiles.merged_params(args.profile)
    except ParamsError as err:
        raise SystemExit(f"quick: {err}") from None
    # every method retrains on a fresh clone; the base is evaluated too (one more stage)
    minutes = validate.estimate_minutes(params, list(params.methods))
    t = params.train
    print(f"quick: {args.profile} over params.yaml ({len(t.seeds)} seed(s) x {t.steps} steps per method), run as the "
          f"temporary DVC experiment {name}: "
          + (f"about {minutes + 1:.0f} min on 2 CPU cores on a fresh clone" if minutes is not None else "duration unknown")
          + " (every method trains unless its model is in the DVC cache). params.yaml and reports/ stay as they are.",
          flush=True)
    cmd = ["dvc", "exp", "run", "--temp", "-n", name, *profiles.set_flags(profile)] + (["--dry"] if args.dry else [])
    t0 = time.time()
    rc = subprocess.run(cmd, env={**os.environ, "DVC_NO_ANALYTICS": "1"}).returncode
    if rc or args.dry:
        sys.exit(rc)
    ref = exp_ref(name)
    if ref is None:
        raise SystemExit(f"quick: dvc exp run finished but no experiment named {name} was found (dvc exp show)")
    reports = export_reports(ref, OUT / name)
    print(f"quick: done in {(time.time() - t0) / 60:.1f} min. Report: {reports / 'report.html'} (and report.md). "
          f"Compare with other experiments: python scripts/exp_table.py; bring it into the workspace: dvc exp apply {name}")


if __name__ == "__main__":
    main()

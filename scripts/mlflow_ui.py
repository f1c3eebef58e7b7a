"""The study's MLflow UI in one command, on a fresh clone too.

    python scripts/mlflow_ui.py              # rebuild the committed study if missing, serve on :5000
    python scripts/mlflow_ui.py --no-serve   # only rebuild (e.g. before scripts/screenshots.py)

mlflow.db is not committed. Before serving, this adds the committed study (the numbers in
reports/, under the experiment name "committed") to ./mlflow.db unless it is already there,
and points the store's artifact paths at this checkout (they are absolute, so a copied or
moved repo would otherwise read and write the original's mlartifacts/). Then it runs
`mlflow ui` on 127.0.0.1 and prints the address of the runs table.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-serve", action="store_true", help="rebuild / relocate the store and exit")
    ap.add_argument("--port", type=int, default=5000)
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    from margrpo.tracking.rebuild import prepare_store

    uri, exp_id = prepare_store(ROOT)
    if args.no_serve:
        return
    if not uri.startswith("sqlite:"):
        raise SystemExit(f"mlflow: MLFLOW_TRACKING_URI={uri} is a server; open its UI instead")
    url = f"http://127.0.0.1:{args.port}/#/experiments/{exp_id}/runs"
    print(f"mlflow: runs table at {url} ; saved views: {url}?viewStateShareKey=studies (one row per study), "
          f"=evaluate (held-out scores), =train (training runs). Ctrl-C stops the server.", flush=True)
    mlflow = Path(sys.executable).with_name("mlflow")
    os.chdir(ROOT)
    os.execv(str(mlflow), [str(mlflow), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                           "--port", str(args.port), "--workers", "1"])


if __name__ == "__main__":
    main()

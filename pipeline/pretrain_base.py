"""Stage pretrain_base: pretrain the embedded TinyMAR on the world's train split.

Writes model.checkpoint (the EMA model, float16 parameters via loading.save_base; committed to git with
`cache: false`, so a fresh clone does not retrain it), reports/pretrain/curve.csv (loss
curve, a DVC plot) and reports/pretrain/metrics.json.
"""
from pipeline.common import preamble

preamble()

import csv  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402

OUT = common.REPORTS / "pretrain"


@task(cache_policy=NO_CACHE)
def run_pretraining(params, study, run_id: str) -> tuple[object, list[dict]]:
    import torch

    from margrpo.models.loading import new_model
    from margrpo.models.pretrain import PretrainSettings, pretrain

    torch.manual_seed(params.pretrain.seed)
    model = new_model(params)
    rows: list[dict] = []

    def on_log(step: int, metrics: dict[str, float]) -> None:
        rows.append({"step": step, **metrics})
        study.log_metrics(run_id, metrics, step)

    settings = PretrainSettings(**params.pretrain.model_dump())
    n_params = sum(p.numel() for p in model.parameters())
    print(f"pretrain: {n_params / 1e6:.2f} M parameters, {settings.steps} steps x {settings.batch_size} images")
    ema = pretrain(model, settings, on_log=on_log, progress=True)
    return ema, rows


@flow(name="pretrain_base")
def pretrain_base() -> None:
    params = common.load()
    study = common.open_study(params)
    run_id = study.child("pretrain_base")
    t0 = time.time()
    ema, rows = run_pretraining(params, study, run_id)
    from margrpo.models.loading import save_base

    out = Path(params.model.checkpoint)
    save_base(ema, out)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "curve.csv", "w", newline="") as f:
        fields = sorted({k for r in rows for k in r} - {"step"})
        writer = csv.DictWriter(f, ["step", *fields])
        writer.writeheader()
        writer.writerows(rows)
    metrics = {"pretrain/steps": params.pretrain.steps, "time/pretrain_s": round(time.time() - t0, 1)}
    if rows:
        metrics["pretrain/final_loss"] = rows[-1]["pretrain/loss"]
    common.write_json(metrics, OUT / "metrics.json")
    study.log_metrics(run_id, metrics, params.pretrain.steps)
    for path in (OUT / "curve.csv", OUT / "metrics.json"):
        study.log_artifact(run_id, path, "pretrain")
    study.finish(run_id)


if __name__ == "__main__":
    pretrain_base()

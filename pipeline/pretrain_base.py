"""Stage pretrain_base: pretrain the embedded TinyMAR on the world's train split.

Writes model.checkpoint (the EMA model, float16 parameters via loading.save_base; committed
to git with `cache: false`, so a fresh clone does not retrain it; swapped in only when
complete), reports/pretrain/curve.csv (loss curve, a DVC plot) and
reports/pretrain/metrics.json.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline import common, proc

OUT = common.REPORTS / "pretrain"


@proc.task()
def run_pretraining(params, study, run_id: str) -> tuple[object, list[dict]]:
    import torch

    from margrpo.models.device import place
    from margrpo.models.loading import new_model
    from margrpo.models.pretrain import pretrain
    from margrpo.world.data import WorldBatches
    from margrpo.world.grammar import VOCAB

    torch.manual_seed(params.pretrain.seed)
    model = place(new_model(params, VOCAB), params.runtime.device, params.runtime.dtype)
    rows: list[dict] = []

    def on_log(step: int, metrics: dict[str, float]) -> None:
        rows.append({"step": step, **metrics})
        study.log_metrics(run_id, metrics, step)

    settings = params.pretrain
    n_params = sum(p.numel() for p in model.parameters())
    print(f"pretrain: {n_params / 1e6:.2f} M parameters, {settings.steps} steps x {settings.batch_size} images "
          f"on {model.device} ({params.runtime.dtype})")
    ema = pretrain(model, settings, WorldBatches(params.world.image_size), on_log=on_log, progress=True)
    return ema, rows


@proc.flow("pretrain_base")
def pretrain_base() -> None:
    params = common.load()
    study = proc.open_study(params)
    run_id = study.child("pretrain_base")
    t0 = time.time()
    ema, rows = run_pretraining(params, study, run_id)
    from margrpo.models.loading import save_base
    from margrpo.report.curves import curve_csv

    out = Path(params.model.checkpoint)
    staged = common.staging_dir(out)
    save_base(ema, staged)
    common.replace_dir(staged, out)
    common.write_text(curve_csv(rows), OUT / "curve.csv")
    metrics = {"pretrain/steps": params.pretrain.steps, "time/pretrain_s": round(time.time() - t0, 1)}
    if rows:
        metrics["pretrain/final_loss"] = rows[-1]["pretrain/loss"]
    common.write_json(metrics, OUT / "metrics.json")
    study.log_metrics(run_id, metrics, params.pretrain.steps)
    for path in (OUT / "curve.csv", OUT / "metrics.json"):
        study.log_artifact(run_id, path, "pretrain")
    study.finish(run_id)


if __name__ == "__main__":
    proc.main("pretrain_base", pretrain_base)

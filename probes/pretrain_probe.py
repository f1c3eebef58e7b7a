"""Pretraining probe: a short base-model run scored on the held-out prompts along the way.

    .venv/bin/python probes/pretrain_probe.py --steps 3000 --every 1000 --save outputs/pprobe/flow_s3 \
        -S model.sampler=flow -S model.flow_shift=3.0

Outside DVC and MLflow: a way to compare samplers and schedules before a pretrain_base run.
pretrain.decay_steps defaults to steps / 5 here. --init continues from a trained base instead
of a fresh model (a longer-pretrained base without rerunning the first steps: set pretrain.seed
to a new value so the continuation draws new scenes, and pretrain.lr / warmup_steps for the
re-warmed schedule). Every --every steps the EMA model is
scored on the held-out GenEval-tag prompts (4 images each, evaluate.seed image seeds) and
on colour following: the share of ink pixels nearest in RGB to the prompted colour for
"a <colour> square" (16 images per colour; chance is 1 / number of colours). One JSON line
per checkpoint on stdout.
"""
from __future__ import annotations

import copy
import json
import time

import torch

from margrpo.cli import params_from_args, script_parser
from margrpo.jsonl import read_jsonl
from margrpo.models.device import place
from margrpo.models.loading import configure, load_model, new_model, save_base
from margrpo.models.pretrain import pretrain
from margrpo.study import heldout_evaluator
from margrpo.world.data import WorldBatches
from margrpo.world.grammar import VOCAB
from margrpo.world.render import COLOR_NAMES, COLOR_TABLE



def colour_following(model, per_colour: int = 16) -> float:
    """Mean share of ink pixels (far from the white background) nearest the prompted colour."""
    names = list(COLOR_NAMES)
    palette = torch.from_numpy(COLOR_TABLE)  # [C, 3] in [0, 1]
    shares = []
    for c in names:
        ro = model.rollout([f"a {c} square"] * per_colour, seeds=torch.arange(per_colour))
        pixels = ro.images.cpu().reshape(per_colour, 3, -1).permute(0, 2, 1)  # [n, HW, 3]
        for px in pixels:
            ink = px[(1 - px).norm(dim=-1) > 0.4]
            if len(ink):
                nearest = ((ink[:, None] - palette[None]) ** 2).sum(-1).argmin(1)
                shares.append((nearest == names.index(c)).float().mean())
    return float(torch.stack(shares).mean()) if shares else 0.0


def main() -> None:
    ap = script_parser(__doc__)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--save", default=None, help="folder for the final EMA model (saved as the committed base is)")
    ap.add_argument("--init", default=None, help="base model folder to continue from (default: a fresh model)")
    a = ap.parse_args()
    params = params_from_args(a, before=[f"pretrain.steps={a.steps}", f"pretrain.decay_steps={a.steps // 5}"])
    metas = [m for m in read_jsonl("prompts/world_heldout.jsonl") if m.get("tag")]
    heldout = heldout_evaluator(params, metas, 4, batch_size=64)
    t0 = time.time()

    def on_checkpoint(step: int, ema) -> None:
        model = copy.deepcopy(ema)
        configure(model, params.sampling)
        s = heldout(model)
        row = {"step": step, "min": round((time.time() - t0) / 60, 2),
               "colour_follow": round(colour_following(model), 3),
               **{k.split("/")[-1]: round(v, 3) for k, v in s.items() if k.startswith("eval/geneval/")}}
        print(json.dumps(row), flush=True)
        if step == a.steps and a.save:
            save_base(model, a.save)

    torch.manual_seed(params.pretrain.seed)
    if a.init:
        model = load_model(a.init, params).requires_grad_(True)
    else:
        model = place(new_model(params, VOCAB), params.runtime.device, params.runtime.dtype)
    pretrain(model, params.pretrain, WorldBatches(params.world.image_size), progress=False,
             on_checkpoint=on_checkpoint, checkpoint_every=a.every)


if __name__ == "__main__":
    main()

"""Structure and numbers of the NOVA / Harmon adapters against the official code.

Run inside a throwaway venv that has the official package (never the project's venv):

    # NOVA: the official diffnext package, installed from a `git archive` of baaivision/NOVA
    python3 -m venv /work/venvs/nova-official
    /work/venvs/nova-official/bin/pip install torch==2.13.0 /path/to/NOVA-export
    PYTHONPATH=src:tests /work/venvs/nova-official/bin/python probes/official_parity.py nova \
        --mar-grpo /path/to/mar-grpo-export

    # Harmon: wusize/Harmon has no setup.py; its source goes on PYTHONPATH
    python3 -m venv /work/venvs/harmon-official
    /work/venvs/harmon-official/bin/pip install torch==2.14.1 torchvision==0.29.1 \
        transformers==4.51.3 diffusers==0.33.1 timm einops mmengine
    PYTHONPATH=src:tests:/path/to/Harmon-export /work/venvs/harmon-official/bin/python \
        probes/official_parity.py harmon

Each run (1) builds the official model at full size on the meta device and writes its
state-dict names and shapes to tests/data/<model>_manifest.json (tests/test_adapters.py
asserts the adapter builds the same); (2) copies one set of random weights into both
implementations at a reduced width and compares, with the same noise (the official noise
is replayed into the adapter through its noise source): the transformer latents z at
every AR step, one head step's Gaussian mean and std, and a full short sample (latents and
decoded images). It prints one JSON line of max abs differences (float32, CPU).
The two halves live in tests/parity_nova.py and tests/parity_harmon.py, next to the tiny-model
fixtures they share (tests/ is on PYTHONPATH in the commands above).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", choices=["nova", "harmon"])
    ap.add_argument("--mar-grpo", type=Path, help="export of AMAP-ML/mar-grpo (NOVA's SDE step with log-prob)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                    help="default dtype of both implementations (float64 separates rounding from bugs)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(getattr(torch, args.dtype))
    if args.model == "nova":  # tests/parity_*.py: the two halves, on PYTHONPATH through tests
        from parity_nova import run
    else:
        from parity_harmon import run
    result = run(args)
    result["dtype"] = args.dtype
    print(json.dumps(result))


if __name__ == "__main__":
    main()

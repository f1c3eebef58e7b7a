"""Replay a few training steps of every method and record every number they produce, so that
a change to the training code can be shown to leave them bitwise the same.

    .venv/bin/python scripts/replay_check.py --out /tmp/before.json     # before the change
    .venv/bin/python scripts/replay_check.py --out /tmp/after.json      # after it
    .venv/bin/python scripts/replay_check.py --compare /tmp/before.json /tmp/after.json

What is replayed and recorded, and how two records compare: margrpo/replay.py. --compare
prints every difference and exits 1 if there is one. Both files must come from the same
number of threads (--threads, default 1). tests/test_replay.py compares one method with the
committed tests/data/replay_grpo_frozen.json (its failure message says how to regenerate it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from margrpo.replay import compare, dumps, record


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="compare two recorded files")
    ap.add_argument("--out", default="replay.json")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--methods", nargs="*", default=None, help="default: every method of the params")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    rec = record(args.params, args.methods, args.seeds, args.steps, args.threads,
                 log=lambda line: print(line, flush=True))
    Path(args.out).write_text(dumps(rec))
    print(f"wrote {args.out} (code from {rec['meta']['margrpo']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The bitwise replay check (scripts/replay_check.py, margrpo/replay.py) on one method: two
training steps of grpo_frozen, seed 0, on the small CPU batch, must reproduce the committed
reference bit for bit (every metric of every step and the final parameters' SHA-256). A change
to the training code that is meant to leave the numbers alone keeps this passing; one that
changes them on purpose regenerates the reference (REGENERATE) and says so in its commit.

On a CPU model other than the reference's, whose kernels round differently (measured on
one: relative differences of 4e-7 to 1.4e-5 after two steps, the final parameters' hash
different), the run must instead repeat itself bit for bit and match the reference to
a relative RTOL: the same maths, another machine's rounding."""
from __future__ import annotations

import json
import math
from pathlib import Path

from margrpo.replay import differences, record

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "replay_grpo_frozen.json"
REGENERATE = (".venv/bin/python scripts/replay_check.py --methods grpo_frozen --seeds 0 --steps 2 "
              "--out tests/data/replay_grpo_frozen.json")


RTOL = 1e-4


def test_grpo_frozen_replays_bitwise(monkeypatch):
    monkeypatch.chdir(ROOT)  # params.yaml's model.checkpoint is relative to the repo root
    ref = json.loads(REFERENCE.read_text())
    meta = ref["meta"]
    methods = sorted({run.split("/")[0] for run in ref["runs"]})

    def run():
        return record("params.yaml", methods, meta["seeds"], meta["steps"], meta["threads"], log=lambda _: None)

    fresh = run()
    if not differences(ref, fresh)[0]:
        return  # bit for bit: the reference's CPU
    again, _ = differences(fresh, run(), "this run", "its repeat")
    assert not again, "two runs on this machine differ:\n" + "\n".join(again[:20])
    diffs, summary = differences(ref, fresh, "the reference", "this run", rtol=RTOL)
    assert not diffs, (f"{summary}; {len(diffs)} differences from {REFERENCE.relative_to(ROOT)}:\n"
                       + "\n".join(diffs[:20])
                       + f"\nIf the change is meant to change the numbers, regenerate the reference (from the repo root):"
                       f"\n    {REGENERATE}\nand say so in the commit.")


def test_the_comparison_sees_one_flipped_bit():
    """Control: a metric that differs in its last bit, and another parameter hash, are reported."""
    ref = json.loads(REFERENCE.read_text())
    changed = json.loads(json.dumps(ref))
    run = next(iter(changed["runs"].values()))
    key = next(k for k, v in run["steps"][-1].items() if isinstance(v, float) and math.isfinite(v))
    run["steps"][-1][key] = math.nextafter(run["steps"][-1][key], math.inf)
    run["params_sha256"] = "0" * 64
    diffs, _ = differences(ref, changed)
    assert any(key in d for d in diffs) and any("final parameters differ" in d for d in diffs), diffs
    assert differences(ref, ref)[0] == []
    tolerant, _ = differences(ref, changed, rtol=RTOL)
    assert tolerant == [], tolerant  # the last bit and the hash are what another CPU changes
    big = next(k for k, v in run["steps"][-1].items() if isinstance(v, float) and math.isfinite(v) and abs(v) > 1e-3)
    run["steps"][-1][big] *= 1 + 10 * RTOL  # a change ten times the tolerance is reported
    assert any(big in d for d in differences(ref, changed, rtol=RTOL)[0])

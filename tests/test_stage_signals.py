"""How a stage tells a kill from a failure (pipeline/proc.py `_unwinding`): an error raised
while a signal unwinds the flow still ends its MLflow runs KILLED; and importing a stage
module sets nothing up. The end-to-end kills (torchrun ranks, SIGKILL, dvc killed alone)
are in tests/test_pipeline_study.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.exceptions import TerminationSignal

from pipeline.proc import _unwinding

REPO = Path(__file__).resolve().parents[1]


def _raised_while_handling(first: BaseException, then: Exception, suppress: bool) -> Exception:
    try:
        try:
            raise first
        except BaseException:
            if suppress:
                raise then from None
            raise then
    except Exception as err:  # noqa: BLE001 - the error under test
        return err


@pytest.mark.parametrize("signal_exc", [TerminationSignal(15), SystemExit(143), KeyboardInterrupt()])
@pytest.mark.parametrize("suppress", [False, True])
def test_an_error_while_unwinding_from_a_signal_is_a_kill(signal_exc, suppress):
    # Prefect reporting the crash to a server that died with the rank: ConnectError.
    err = _raised_while_handling(signal_exc, ConnectionRefusedError("[Errno 111] Connection refused"), suppress)
    assert _unwinding(err)


def test_an_ordinary_error_is_a_failure():
    assert not _unwinding(ValueError("bad"))
    assert not _unwinding(_raised_while_handling(KeyError("x"), RuntimeError("while handling"), suppress=False))


STAGES = ("prepare_prompts", "pretrain_base", "sample_baseline", "train", "evaluate", "report", "validate")


def test_importing_a_stage_runs_nothing():
    """Every stage's setup (signal handlers, lock, reaper) and its Prefect / torch imports
    happen in pipeline.proc.main, never at import."""
    code = ("import signal, sys, psutil\n"
            + "".join(f"import pipeline.{s}\n" for s in STAGES)
            + "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, psutil.Process().children(),"
              " sorted(m for m in ('prefect', 'torch', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.split() == ["True", "[]", "[]"], out.stdout + out.stderr

"""The out-of-process path for real: the scoring server started on loopback by the client,
the one-shot CLI, a failing backend, and a killed server (no lost work)."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from margrpo.rewards.base import build_reward
from margrpo.rewards.remote import RemoteReward, RemoteScorerError

from .conftest import random_images

PLUGIN = textwrap.dedent('''
    import torch
    from margrpo.rewards.base import register_reward

    class Brightness:
        name = "brightness_test"
        def __init__(self, offset=0.0):
            self.offset = float(offset)
        def __call__(self, images, prompts, metadata):
            if any(p == "boom" for p in prompts):
                raise ValueError("prompt boom is not scorable")
            bonus = torch.tensor([float(m.get("bonus", 0)) for m in metadata])
            return images.mean(dim=(1, 2, 3)) + self.offset + bonus

    @register_reward("brightness_test")
    def _build(**kw):
        return Brightness(**kw)
''')


@pytest.fixture
def plugin_dir(tmp_path):
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "brightness_plugin.py").write_text(PLUGIN)
    return tmp_path / "plug"


def expected(images, offset, bonus):
    q = images.clamp(0, 1).mul(255).round().div(255)  # the PNG round trip
    return q.mean(dim=(1, 2, 3)) + offset + torch.tensor(bonus, dtype=torch.float32)


def test_server_started_by_client_scores_like_local(plugin_dir, tmp_path):
    reward = build_reward("remote", backend="brightness_test", python=sys.executable,
                          plugins=["brightness_plugin"], pythonpath=[str(plugin_dir)],
                          workdir=str(tmp_path / "w"), offset=0.5, startup_timeout=120)
    try:
        assert reward.url.startswith("http://127.0.0.1:")
        images = random_images(5, 24, 20)
        meta = [{"bonus": i} for i in range(5)]
        scores = reward(images, ["p"] * 5, meta)
        torch.testing.assert_close(scores, expected(images, 0.5, list(range(5))), atol=1e-5, rtol=0)
        # a second batch on the same server (model loaded once); batches are cleaned up
        reward(random_images(2, 8, 8, seed=3), ["q", "r"], [{}, {}])
        assert not any((tmp_path / "w" / "batches").iterdir())
        # a backend error comes back as a clear error; the server stays up
        with pytest.raises(RemoteScorerError, match="boom is not scorable") as e:
            reward(images[:1], ["boom"], [{}])
        assert "kept at" in str(e.value)
        assert reward(images[:1], ["ok"], [{}]).shape == (1,)
        # a second client attaches to the running server by URL
        other = RemoteReward("brightness_test", url=reward.url, workdir=str(tmp_path / "w2"))
        torch.testing.assert_close(other(images[:2], ["a", "b"], [{}, {}]), scores[:2] - torch.tensor([0.0, 1.0]))
    finally:
        reward.close()
    assert reward.proc.poll() is not None


def test_killed_server_keeps_the_batch_and_cli_rescores_it(plugin_dir, tmp_path):
    reward = RemoteReward("brightness_test", {"offset": 1.0}, python=sys.executable,
                          plugins=["brightness_plugin"], pythonpath=[str(plugin_dir)],
                          workdir=str(tmp_path / "w"))
    os.kill(reward.proc.pid, signal.SIGKILL)
    reward.proc.wait(timeout=10)
    images = random_images(3, 16, 16, seed=7)
    with pytest.raises(RemoteScorerError) as e:
        reward(images, ["a", "b", "c"], [{}, {}, {}])
    msg = str(e.value)
    assert "exited with code" in msg and "Nothing is lost" in msg
    cmd_line = msg.strip().splitlines()[-1].strip()
    batch = next((tmp_path / "w" / "batches").iterdir())
    assert len(list(batch.glob("*.png"))) == 3
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_dir), os.environ.get("PYTHONPATH", "")]))
    subprocess.run(shlex.split(cmd_line), check=True, env=env, timeout=120)
    rows = [json.loads(l) for l in (batch / "scores.jsonl").read_text().splitlines()]
    got = torch.tensor([r["score"] for r in rows])
    torch.testing.assert_close(got, expected(images, 1.0, [0, 0, 0]), atol=1e-5, rtol=0)


def test_startup_failure_and_unreachable_url_are_clear(tmp_path):
    with pytest.raises(RemoteScorerError, match="exited with code") as e:
        RemoteReward("pickscore", {"model_path": str(tmp_path / "missing")}, python=sys.executable,
                     workdir=str(tmp_path / "w"))
    assert "missing" in str(e.value) and "model_path" in str(e.value)
    with pytest.raises(RemoteScorerError, match="no scorer answers"):
        RemoteReward("pickscore", url="http://127.0.0.1:9", workdir=str(tmp_path / "w2"))
    with pytest.raises(FileNotFoundError, match="rewards\\[\\].python"):
        RemoteReward("pickscore", python=str(tmp_path / "nope" / "python"))

"""The reward table: each built-in row names a factory that exists and takes exactly the
keys the row lists; building imports only the backend asked for; plugins add rows."""
from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from margrpo.rewards.base import build_reward, resolve
from margrpo.rewards.table import CLIENT_KEYS, REWARDS, WORLD_MODES, check_spec

# Rows whose factory is a `build(**kwargs)` that runs the class in process or remotely.
IN_PROCESS = {"hpsv2": "margrpo.rewards.hps:HPSReward", "imagereward": "margrpo.rewards.imagereward:ImageRewardReward",
              "vqascore": "margrpo.rewards.vqascore:VQAScoreReward"}
BUILTIN = ["world", "clipscore", "pickscore", "aesthetic", "hpsv2", "imagereward", "vqascore", "remote"]


@pytest.mark.parametrize("name", BUILTIN)
def test_row_keys_match_the_factory_signature(name):
    row = REWARDS[name]
    factory = resolve(row.target)
    if name == "remote":
        assert row.args is None and "backend" in inspect.signature(factory).parameters
        return
    cls = resolve(IN_PROCESS[name]) if name in IN_PROCESS else factory
    keys = set(inspect.signature(cls).parameters) - {"self"}
    expected = keys | (set(CLIENT_KEYS) if name in IN_PROCESS else set())
    assert set(row.args) == expected, f"{name}: table {sorted(row.args)} vs factory {sorted(expected)}"


def test_world_modes_are_the_rewards_modes():
    from margrpo.world.reward import MODES, WorldReward

    assert MODES == WORLD_MODES == REWARDS["world"].args["mode"]
    with pytest.raises(ValueError, match="mode must be one of"):
        WorldReward(mode="nope")


def test_check_spec_names_the_problem():
    assert check_spec({"name": "world", "weight": 1.0, "mode": "aligned"}) == []
    assert check_spec({"name": "nope"})[0].startswith("name: unknown reward 'nope'")
    assert check_spec({"name": "world", "mode": "x"})[0].startswith("mode: 'x' is not one of")
    assert check_spec({"name": "clipscore", "model_pth": "/w"})[0].startswith("model_pth: unknown key")
    assert check_spec({"name": "remote", "backend": "anything", "whatever": 1}) == []


def test_unknown_reward_error_lists_the_table():
    with pytest.raises(ValueError, match="unknown reward 'nope'; available: .*world"):
        build_reward("nope")


def test_building_one_reward_imports_no_other_backend():
    code = ("import sys; from margrpo.rewards.base import build_reward; build_reward('world', mode='partial'); "
            "print(sorted(m for m in sys.modules if m.startswith('margrpo.rewards.') and m not in "
            "('margrpo.rewards.base', 'margrpo.rewards.table')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_plugin_rows_are_added_once(monkeypatch):
    from margrpo.rewards.base import register_reward

    monkeypatch.delitem(REWARDS, "plugin_test", raising=False)

    @register_reward("plugin_test")
    def make(scale=1.0):
        return lambda images, prompts, metadata: images.mean((1, 2, 3)) * scale

    assert REWARDS["plugin_test"].args is None and build_reward("plugin_test", scale=2.0) is not None
    with pytest.raises(ValueError, match="already in the table"):
        register_reward("plugin_test")(make)
    monkeypatch.delitem(REWARDS, "plugin_test")

"""Bad input at the config level: every malformed params.yaml, override or base checkpoint
gets one ParamsError that names the file, the line (or the override) and the key, with a
fix, in well under 5 s and before any work; the code defaults are the study's values.

Each case edits a copy of the shipped params.yaml as text (so the line a message names is
known independently of the code under test) or passes overrides, then asserts the message.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from margrpo.config import ParamsError, Params, load_params, parse_params

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = (ROOT / "params.yaml").read_text()


def key_line(lines: list[str], dotted: str) -> int:
    """0-based index of the line that holds `dotted` in block-style YAML text (list entries
    "- key: v" by index)."""
    start, end, indent, dash = 0, len(lines), 0, None
    for part in dotted.split("."):
        if part.isdigit():
            items = [i for i in range(start, end) if re.match(rf"^ {{{indent}}}- ", lines[i])]
            dash = items[int(part)]
            nxt = [i for i in items if i > dash]
            start, end, indent = dash, nxt[0] if nxt else end, indent + 2
            continue
        pattern = rf"^ {{{indent}}}{re.escape(part)}:" + (rf"|^ {{{indent - 2}}}- {re.escape(part)}:" if dash is not None else "")
        found = [i for i in range(start, end) if re.match(pattern, lines[i])]
        assert len(found) == 1, f"{dotted}: {part!r} found {len(found)} times"
        line = found[0]
        below = [i for i in range(line + 1, end)
                 if lines[i].strip() and not lines[i].lstrip().startswith("#") and len(lines[i]) - len(lines[i].lstrip()) <= indent]
        start, end, indent, dash = line, below[0] if below else end, indent + 2, None
    return line


def set_key(text: str, dotted: str, value: str) -> tuple[str, int]:
    """text with the value of `dotted` replaced (its comment dropped); (text, 1-based line)."""
    lines = text.splitlines()
    i = key_line(lines, dotted)
    key = dotted.split(".")[-1]
    lines[i] = lines[i][: lines[i].index(f"{key}:") + len(key) + 1] + f" {value}"
    return "\n".join(lines) + "\n", i + 1


def add_key(text: str, section: str, key: str, value: str) -> tuple[str, int]:
    """text with `key: value` added as the first entry of `section` ("" = top level)."""
    lines = text.splitlines()
    if not section:
        return f"{key}: {value}\n" + text, 1
    i = key_line(lines, section)
    indent = section.count(".") * 2 + 2
    lines.insert(i + 1, " " * indent + f"{key}: {value}")
    return "\n".join(lines) + "\n", i + 2


def drop_key(text: str, dotted: str) -> tuple[str, int]:
    """text without the line of `dotted` (a one-line key); (text, line of its parent)."""
    lines = text.splitlines()
    i = key_line(lines, dotted)
    parent = key_line(lines, dotted.rpartition(".")[0])
    del lines[i]
    return "\n".join(lines) + "\n", parent + 1


REWARDS_BLOCK = re.compile(r"^rewards:\n(?:  .*\n|\s*\n|#.*\n)*", re.M)


def rewards_block(text: str, entries: str) -> tuple[str, int]:
    """text with the rewards section replaced by `entries` (YAML lines); (text, its line)."""
    m = REWARDS_BLOCK.search(text)
    return text[: m.start()] + "rewards:\n" + entries + "\n" + text[m.end():], text[: m.start()].count("\n") + 1


def reward_entry(text: str, entry: str) -> tuple[str, int]:
    """text whose only reward is `entry` (a flow mapping); (text, the entry's line)."""
    text, line = rewards_block(text, f"  - {entry}")
    return text, line + 1


def bad_methods(text: str, body: str) -> tuple[str, int]:
    start = text.index("\nmethods:") + 1
    rest = text[start:]
    nxt = re.search(r"^\S", rest[len("methods:"):], re.M)
    end = start + len("methods:") + (nxt.start() if nxt else len(rest))
    return text[:start] + "methods:" + body + "\n" + text[end:], text[:start].count("\n") + 1


# (id, edit of the shipped text -> (text, line), key the message must name)
FILE_CASES = [
    ("lr_inf", lambda t: set_key(t, "train.lr", ".inf"), "train.lr"),
    ("lr_nan", lambda t: set_key(t, "train.lr", ".nan"), "train.lr"),
    ("k_nan", lambda t: set_key(t, "k", ".nan"), "k"),
    ("lr_zero", lambda t: set_key(t, "train.lr", "0"), "train.lr"),
    ("lr_word", lambda t: set_key(t, "train.lr", "fast"), "train.lr"),
    ("steps_word", lambda t: set_key(t, "train.steps", "sixty"), "train.steps"),
    ("k_range", lambda t: set_key(t, "k", "1.5"), "k"),
    ("images_zero", lambda t: set_key(t, "evaluate.images_per_prompt", "0"), "evaluate.images_per_prompt"),
    ("eval_seed_float", lambda t: set_key(t, "evaluate.seed", "1.5"), "evaluate.seed"),
    ("estimator", lambda t: set_key(t, "methods.mar_grpo.estimator", "magic"), "methods.mar_grpo.estimator"),
    ("sampler", lambda t: set_key(t, "model.sampler", "ddim"), "model.sampler"),
    ("lr_schedule", lambda t: set_key(t, "train.lr_schedule", "exp"), "train.lr_schedule"),
    ("group_size_1", lambda t: set_key(t, "train.group_size", "1"), "train.group_size"),
    ("betas_range", lambda t: set_key(t, "train.adam_betas", "[1.5, 0.999]"), "train.adam_betas.0"),
    ("betas_one", lambda t: set_key(t, "train.adam_betas", "[0.9, 1.0]"), "train.adam_betas.1"),
    ("betas_length", lambda t: set_key(t, "train.adam_betas", "[0.9]"), "train.adam_betas.1"),
    ("seeds_repeat", lambda t: set_key(t, "train.seeds", "[0, 0]"), "train.seeds"),
    ("seeds_empty", lambda t: set_key(t, "train.seeds", "[]"), "train.seeds"),
    ("seeds_negative", lambda t: set_key(t, "train.seeds", "[0, -1]"), "train.seeds.1"),
    ("window_small", lambda t: set_key(t, "train.loss_head_window", "3"), "train.loss_head_window"),
    ("window_large", lambda t: set_key(t, "train.loss_head_window", "99"), "train.loss_head_window"),
    ("flow_shift_zero", lambda t: set_key(t, "model.flow_shift", "0"), "model.flow_shift"),
    ("image_size_patch", lambda t: set_key(t, "world.image_size", "36"), "world.image_size"),
    ("ar_steps_tokens", lambda t: set_key(t, "sampling.num_ar_steps", "17"), "sampling.num_ar_steps"),
    ("decay_steps", lambda t: set_key(t, "pretrain.decay_steps", "9000"), "pretrain.decay_steps"),
    ("unknown_top", lambda t: add_key(t, "", "foo", "1"), "foo"),
    ("unknown_nested", lambda t: add_key(t, "world", "seeed", "1"), "world.seeed"),
    ("unknown_method_key", lambda t: add_key(t, "methods.mar_grpo", "topkk", "true"), "methods.mar_grpo.topkk"),
    ("method_missing_key", lambda t: drop_key(t, "methods.grpo.freeze_head"), "methods.grpo.freeze_head"),
    ("method_reads_no_longer", lambda t: add_key(t, "methods.grpo", "reads", "[train, train, train]"),
     "methods.grpo.reads"),
    ("claims_names_no_method", lambda t: set_key(t, "claims.resample", "mar_grpoo"), "claims.resample"),
    ("claims_wrong_settings", lambda t: set_key(t, "claims.resample", "posterior"), "claims.resample"),
    ("claims_committed_speculative", lambda t: set_key(t, "claims.speculative", "grpo_frozen"), "claims.speculative"),
    ("claims_unknown_role", lambda t: add_key(t, "claims", "baseline", "grpo"), "claims.baseline"),
    ("claims_not_a_name", lambda t: set_key(t, "claims.grpo", "[grpo]"), "claims.grpo"),
    ("methods_empty", lambda t: bad_methods(t, " {}"), "methods"),
    ("reward_weight_zero", lambda t: reward_entry(t, "{name: world, weight: 0, mode: partial}"), "rewards.0.weight"),
    ("reward_total_negative", lambda t: rewards_block(t, "  - {name: world, weight: -1.0, mode: partial}"), "rewards"),
    ("reward_unknown_name", lambda t: reward_entry(t, "{name: worlds, weight: 1.0}"), "rewards.0.name"),
    ("reward_unknown_mode", lambda t: reward_entry(t, "{name: world, weight: 1.0, mode: algined}"), "rewards.0.mode"),
    ("reward_unknown_key", lambda t: reward_entry(t, "{name: world, weight: 1.0, mod: partial}"), "rewards.0.mod"),
    ("reward_kwarg_inf", lambda t: reward_entry(t, "{name: world, weight: 1.0, image_size: .inf}"), "rewards.0.image_size"),
    ("reward_weight_inf", lambda t: reward_entry(t, "{name: world, weight: .inf}"), "rewards.0.weight"),
    ("rewards_empty", lambda t: rewards_block(t, "  []"), "rewards"),
]


@pytest.mark.parametrize("case, edit, key", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_value_names_file_line_key_and_fix(tmp_path, case, edit, key):
    text, line = edit(SHIPPED)
    path = tmp_path / "params.yaml"
    path.write_text(text)
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert f"params.yaml:{line}: {key}:" in msg, msg
    assert "\n    fix: " in msg and msg.count("\n") <= 4, msg  # one problem: header, problem, fix


def test_dvc_added_key_and_nested_key_are_errors(tmp_path):
    """`dvc exp run -S +foo=1` and `+world.seeed=1` as the overrides DVC writes."""
    with pytest.raises(ParamsError, match=r"override foo=1\): foo: unknown key"):
        load_params(ROOT / "params.yaml", {"foo": 1})
    with pytest.raises(ParamsError, match=r"override world.seeed=1\): world.seeed: unknown key"):
        load_params(ROOT / "params.yaml", {"world.seeed": 1})


@pytest.mark.parametrize("content, expect", [
    (None, r"params.yaml: not found \(looked for .*\)"),
    ("", r"params.yaml is empty. Restore it with `git checkout -- .*params.yaml`"),
    ("# only a comment\n", r"params.yaml is empty"),
    ("- a\n- b\n", r"params.yaml: the top level is a list"),
    ("k: 0.3\ntrain:\n  lr: [1\n", r"params.yaml:4: not valid YAML"),
    ("k: 0.3\nk: 0.5\n", r"params.yaml:2: k appears twice \(also line 1\)"),
    (b"k: 0.3\nworld:\n  seed: \xff\n", r"params.yaml:3: not UTF-8"),
], ids=["missing", "empty", "comments_only", "list", "yaml_syntax", "duplicate_key", "not_utf8"])
def test_bad_file_names_it(tmp_path, content, expect):
    path = tmp_path / "params.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ParamsError, match=expect):
        load_params(path)


@pytest.mark.parametrize("overrides, expect", [
    ({"rewards.3.mode": "geneval"}, r"rewards is a list of 1 entries; '3' is not an index"),
    ({"k.x": 1}, r"override k.x: the top level.*k|override k.x: k in .* is the value 0.3"),
    ({"rewards.0.mode": "geneval", "train.lr": float("nan")}, r"override train.lr=nan\): train.lr: Input should be a finite"),
], ids=["list_index", "into_scalar", "nan_override"])
def test_bad_overrides_are_named(overrides, expect):
    with pytest.raises(ParamsError, match=expect):
        load_params(ROOT / "params.yaml", overrides)


def test_overrides_reach_list_entries_and_new_keys():
    p = load_params(ROOT / "params.yaml", {"rewards.0.mode": "geneval", "methods.mar_grpo.lr": 2e-4, "train.lr": "3e-4"})
    assert p.rewards[0].model_dump()["mode"] == "geneval"
    assert p.methods["mar_grpo"].lr == 2e-4 and p.train.lr == 3e-4


def test_one_walker_gets_sets_and_deletes_dotted_keys_with_list_indices():
    """paramfile's walker, used by the overrides, the guard and its restore (plain and
    round-trip YAML trees alike)."""
    from ruamel.yaml import YAML

    from margrpo import paramfile

    text = "k: 0.3\nrewards:\n  - {name: world, weight: 1.0}\ntrain:\n  seeds: [0, 1, 2]\n  adam_betas: [0.9, 0.999]\n"
    for tree in (yaml.safe_load(text), YAML().load(text)):
        assert paramfile.get(tree, "rewards.0.weight") == 1.0 and paramfile.get(tree, "train.adam_betas.1") == 0.999
        assert paramfile.lookup(tree, "rewards.1.weight") == (False, None)
        assert paramfile.get(tree, "k.x", "absent") == "absent" and paramfile.get(tree, "train.seeds.x") is None
        paramfile.set_key(tree, "rewards.0.weight", 2.0)
        paramfile.set_key(tree, "world.new.deep", 1)
        assert tree["rewards"][0]["weight"] == 2.0 and tree["world"]["new"] == {"deep": 1}
        assert paramfile.delete_key(tree, "train.seeds.0") and list(tree["train"]["seeds"]) == [1, 2]
        assert paramfile.delete_key(tree, "world.new") and not paramfile.delete_key(tree, "world.new")
        with pytest.raises(ParamsError, match=r"rewards.3.mode: rewards is a list of 1 entries; '3' is not an index"):
            paramfile.set_key(tree, "rewards.3.mode", "x")
        with pytest.raises(ParamsError, match=r"k.x: k in params.yaml is the value 0.3, not a section"):
            paramfile.set_key(tree, "k.x", 1)


def _checkpoint_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "base"
    dst.mkdir()
    for f in (ROOT / "models" / "base").iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("damage, expect", [
    ("missing", r"model.checkpoint: .*nope: no such folder\n    fix: .*dvc repro pretrain_base"),
    ("truncated", r"model.checkpoint: .*diffusion_pytorch_model.safetensors: tensors end at byte \d+ but the file has"),
    ("no_weights", r"model.checkpoint: .*no diffusion_pytorch_model.safetensors"),
    ("bad_config", r"model.checkpoint: .*config.json:1: not valid JSON"),
], ids=["missing", "truncated", "no_weights", "bad_config"])
def test_bad_checkpoint_is_named_when_required(tmp_path, damage, expect):
    ckpt = tmp_path / "nope" if damage == "missing" else _checkpoint_copy(tmp_path)
    weights = ckpt / "diffusion_pytorch_model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "bad_config":
        (ckpt / "config.json").write_text("{not json")
    overrides = {"model.checkpoint": str(ckpt)}
    with pytest.raises(ParamsError, match=expect):
        load_params(ROOT / "params.yaml", overrides, require_checkpoint=True)
    # pretraining writes the checkpoint, so it validates without one
    assert load_params(ROOT / "params.yaml", overrides).model.checkpoint == str(ckpt)


def test_shipped_checkpoint_and_params_validate():
    assert load_params(ROOT / "params.yaml", require_checkpoint=True).methods


def test_cli_exits_2_with_the_message_and_no_traceback_fast(tmp_path):
    text, line = set_key(SHIPPED, "train.lr", ".inf")
    (tmp_path / "params.yaml").write_text(text)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "margrpo.config", str(tmp_path / "params.yaml"), "--no-checkpoint"],
                         capture_output=True, text=True, cwd=ROOT)
    elapsed = time.perf_counter() - t
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert f"params.yaml:{line}: train.lr: Input should be a finite number" in out.stderr
    assert elapsed < 5, f"validation took {elapsed:.1f} s"
    ok = subprocess.run([sys.executable, "-m", "margrpo.config", "params.yaml"], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0 and "valid" in ok.stdout


def test_validation_imports_no_torch():
    code = "import sys; from margrpo.config import load_params; load_params('params.yaml'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_code_defaults_are_the_study_values():
    """One default per field: building params from the methods alone gives params.yaml
    (so a value changed in one place but not the other fails here, naming the key)."""
    shipped = yaml.safe_load(SHIPPED)
    # methods and the claims' roles, which name methods, have no default
    from_code = Params(methods=shipped["methods"], claims=shipped["claims"]).model_dump()
    from_file = load_params(ROOT / "params.yaml").model_dump()
    differ = {k: (from_code[k], from_file[k]) for k in from_file if from_code[k] != from_file[k]}
    nested = {f"{k}.{f}": (a[f], b[f]) for k, (a, b) in differ.items() if isinstance(a, dict)
              for f in b if a.get(f) != b[f]}
    assert not differ, f"code default vs params.yaml: {nested or differ}"


def test_every_field_has_the_study_default_or_none():
    """Fields without a default are exactly those params.yaml must give (methods; a method's
    freeze_head); every other field's default is set (a claims role: none, no method plays it)."""
    from margrpo.config import ClaimsConfig, MethodConfig

    required = {name for name, f in Params.model_fields.items() if f.is_required()}
    assert required == {"methods"}
    assert {name for name, f in MethodConfig.model_fields.items() if f.is_required()} == {"freeze_head"}
    assert all(f.default is None for f in ClaimsConfig.model_fields.values())
    params = parse_params({"methods": {"m": {"freeze_head": True}}})
    assert params.methods["m"].estimator == "single" and params.claims.roles() == {}


def test_every_key_is_documented_in_the_schema():
    """Each key's Field carries its description: the one place a key is documented."""
    from pydantic import BaseModel

    from margrpo.config import MethodConfig

    def undocumented(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            inner = field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                out += undocumented(inner, f"{prefix}{name}.")
            elif not field.description:
                out.append(prefix + name)
        return out

    assert undocumented(Params, "") + undocumented(MethodConfig, "methods.<name>.") == []


def test_knobs_follow_from_a_methods_settings_and_roles_name_methods():
    from margrpo.config import knobs_read

    p = parse_params({"methods": {"g": {"freeze_head": False}, "r": {"freeze_head": True, "estimator": "resample"},
                                  "t": {"freeze_head": True, "estimator": "posterior", "topk": True},
                                  "c": {"freeze_head": True, "consistency": True}}})
    assert {m: knobs_read(c) for m, c in p.methods.items()} == {
        "g": (), "r": ("num_trajectories",), "t": ("k", "num_trajectories"), "c": ("tau",)}
    assert (p.method("g").k, p.method("g").tau, p.method("g").num_trajectories) == (1.0, -1.0, 1)  # all off
    assert (p.method("t").k, p.method("t").tau, p.method("t").num_trajectories) == (0.3, -1.0, 4)
    with pytest.raises(ParamsError, match=r"methods.m.reads: is not a setting: .*\n    fix: delete the line"):
        parse_params({"methods": {"m": {"freeze_head": True, "reads": ["train"] * 3}}})
    with pytest.raises(ParamsError, match=r"claims.grpo: 'x' names no method of params.yaml's methods \(m\)\n    fix: "
                       r"set it to the method that plays grpo, or delete the line"):
        parse_params({"methods": {"m": {"freeze_head": True}}, "claims": {"grpo": "x"}})
    with pytest.raises(ParamsError, match=r"claims.grpo: m does not have the settings of the role \(freeze_head: "
                       r"true\)\n    fix: name a method with freeze_head: false"):
        parse_params({"methods": {"m": {"freeze_head": True}}, "claims": {"grpo": "m"}})

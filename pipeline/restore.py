"""Put params.yaml back after a workspace `dvc exp run -S key=value` that failed validation.

What DVC does (3.67, measured): a workspace `dvc exp run -S k=5` writes k: 5 into the
workspace's params.yaml (round-trip YAML, comments kept) before any stage runs, and leaves
it there when a stage fails; the next `dvc repro` or `dvc exp run` then starts from the
rejected value. DVC keeps no copy of the file as it was.

So the guard stage, on rejecting params, reads the -S / --set-param overrides from the
command line of the `dvc exp run` process that runs it, and sets exactly those keys back
to their value at HEAD (keys that HEAD lacks, like `-S +foo=1`, are removed), with DVC's
own round-trip YAML writer so comments and layout stay. The user's other uncommitted edits
of params.yaml stay as they were. When the result equals HEAD's params, HEAD's file is
restored byte for byte. A plain `dvc repro` (the user edited params.yaml by hand) and
`--temp` / `--queue` runs (a scratch copy) are left alone.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml


def _override_values(argv: list[str]) -> list[str] | None:
    """The -S values of a `dvc exp run` command line, or None if it is not one."""
    words = [Path(a).name if i < 2 else a for i, a in enumerate(argv)]
    try:
        start = next(i for i in range(len(words) - 1) if words[i] == "exp" and words[i + 1] == "run")
    except StopIteration:
        return None
    if "dvc" not in " ".join(words[:start]):
        return None
    values, args = [], argv[start + 2:]
    for i, arg in enumerate(args):
        if arg in ("-S", "--set-param") and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith("--set-param="):
            values.append(arg.split("=", 1)[1])
        elif arg.startswith("-S") and len(arg) > 2:
            values.append(arg[2:])
    return values


def exp_run_overrides() -> list[str] | None:
    """Dotted keys of params.yaml that the `dvc exp run` running this process overrides."""
    import psutil

    proc = psutil.Process().parent()
    while proc is not None:
        try:
            values = _override_values(proc.cmdline())
        except psutil.Error:
            values = None
        if values is not None:
            return [key for key in map(override_key, values) if key]
        proc = proc.parent()
    return None


def override_key(value: str) -> str | None:
    """'k=0.5' -> 'k'; '+foo.bar=1' -> 'foo.bar'; 'params.yaml:k=1' -> 'k'; another file -> None."""
    target, _, _ = value.partition("=")
    if ":" in target:
        path, _, target = target.partition(":")
        if Path(path).name != "params.yaml":
            return None
    return target.lstrip("+~") or None


def _head_text(path: Path) -> str | None:
    proc = subprocess.run(["git", "show", f"HEAD:{path.as_posix()}"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else None


def _lookup(tree, parts: list[str]):
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def revert_keys(path: Path, keys: list[str], head: dict) -> None:
    """Set each dotted key of `path` back to its value in `head`, or delete it there."""
    from dvc.utils.serialize import modify_yaml  # the round-trip writer `dvc exp run -S` used

    with modify_yaml(path) as data:
        for key in keys:
            *parents, leaf = key.split(".")
            found, node = _lookup(data, parents)
            if not found or not isinstance(node, dict):
                continue
            had, value = _lookup(head, key.split("."))
            if had:
                node[leaf] = value
            else:
                node.pop(leaf, None)


def in_workspace_exp_run() -> bool:
    """A workspace `dvc exp run` (not --temp / --queue, which run in a scratch copy)."""
    return bool(os.environ.get("DVC_EXP_NAME")) and ".dvc/tmp/exps" not in Path.cwd().resolve().as_posix()


def restore_after_failed_exp_run(path: Path) -> str | None:
    """Undo the rejected -S overrides; returns what was done (None if nothing)."""
    if not in_workspace_exp_run():
        return None
    keys = exp_run_overrides()
    head_text = _head_text(path)
    if not keys or head_text is None:
        return None
    head = yaml.safe_load(head_text) or {}
    revert_keys(path, keys, head)
    if yaml.safe_load(path.read_text()) == head:
        path.write_text(head_text)
    return (f"params.yaml: put back {', '.join(keys)} as committed (DVC had written the rejected -S value(s) "
            f"into the workspace)")

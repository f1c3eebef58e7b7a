"""Put the params files back, byte for byte, after a workspace `dvc exp run -S ...` that
the guard rejected.

What a workspace `dvc exp run -S key=value` does (DVC 3.67, measured):
1. it stashes the workspace's uncommitted changes as a git stash commit (parents HEAD and
   an index commit, "WIP on <branch>: ..."), puts them back and drops the stash: that
   commit stays in the object store, unreachable, holding every file as it was;
2. it rewrites each file an -S names (params.yaml unless `file:key=value`) whole, with
   dvc.utils.hydra.apply_overrides: the keys set, and every list replaced by a plain one,
   so flow lists `[0, 1, 2]` become block lists, a comment after a list is lost (the
   section header below it, say) and `null` is written as an empty value;
3. it runs the stages on the rewrite and leaves it in the workspace when a stage fails.
So the rewrite alone does not give back the file as it was: its layout is gone, and so
is the value an -S replaced.

What was there before the command is the source of the rewrite: the file in this run's
stash commit when the workspace had uncommitted changes (an unreachable stash commit on
top of HEAD, made after the `dvc exp run` process started), HEAD's file otherwise. A
source is written back only when DVC's own rewrite of it, with the same -S values,
reproduces the current file byte for byte: then the user's uncommitted edits, comments
and layout come back exactly. If no source passes (the file was edited while the command
ran, or git's object store could not be searched in time), the -S keys alone are set
back to the source's values with DVC's round-trip writer, and the message says that the
layout may differ. A plain `dvc repro` (nothing rewritten) and `--temp` / `--queue`
runs (a scratch copy) are left alone.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import yaml

from margrpo import paramfile
from margrpo.atomic import write_bytes

# `git fsck` lists the unreachable commits; bounded so that the guard answers in seconds
# even in a large repository (then only HEAD's file is a candidate).
FSCK_S = 3.0
# A process's start time (psutil, from the boot time in whole seconds) and a commit's (whole
# seconds) may each be off by up to a second.
CLOCK_S = 2


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


def exp_run_command() -> tuple[list[str], float] | None:
    """(-S values, start time) of the `dvc exp run` process that runs this one, or None."""
    import psutil

    proc = psutil.Process().parent()
    while proc is not None:
        try:
            values = _override_values(proc.cmdline())
            if values is not None:
                return values, proc.create_time()
        except psutil.Error:
            pass
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


def _git(*args: str, stdin: bytes | None = None, timeout: float = 10.0) -> bytes | None:
    try:
        proc = subprocess.run(["git", *args], input=stdin, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def stash_commits(head: str, since: float) -> list[str]:
    """Unreachable git stash commits on top of `head` made at or after `since` (epoch
    seconds), newest first: a `dvc exp run` started then stashed the workspace in one. DVC's
    own experiment stash commits ("dvc-exp:...") and one-parent index commits are not."""
    out = _git("fsck", "--unreachable", "--no-reflogs", "--connectivity-only", "--no-progress", timeout=FSCK_S)
    shas = [line.split()[2] for line in (out or b"").decode().splitlines() if line.startswith("unreachable commit ")]
    if not shas:
        return []
    log = _git("log", "--no-walk=unsorted", "--stdin", "--format=%H %ct %P%x09%s", stdin="\n".join(shas).encode(),
               timeout=FSCK_S)
    found = []
    for line in (log or b"").decode().splitlines():
        meta, _, subject = line.partition("\t")
        sha, seconds, *parents = meta.split()
        if parents[:1] == [head] and len(parents) >= 2 and int(seconds) >= since - CLOCK_S \
                and not subject.startswith("dvc-exp:"):
            found.append((int(seconds), sha))
    return [sha for _, sha in sorted(found, reverse=True)]


def dvc_rewrite(text: bytes, path: str, overrides: list[str]) -> bytes:
    """The file `dvc exp run -S` writes from `text`: DVC's own writer on a scratch copy."""
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(path).name
        copy.write_bytes(text)
        apply_overrides(copy, overrides)
        return copy.read_bytes()


def _write_bytes(path: Path, data: bytes) -> None:
    """Whole or not at all (a temporary file renamed over it), with the file's mode."""
    write_bytes(data, path, keep_mode=True)


def revert_keys(path: Path, keys: list[str], source: dict) -> None:
    """Set each dotted key of `path` back to its value in `source`, or delete it there, with
    DVC's round-trip writer (comments kept where DVC kept them)."""
    from dvc.utils.serialize import modify_yaml

    with modify_yaml(path) as data:
        for key in keys:
            found, value = paramfile.lookup(source, key)
            try:
                if found:
                    paramfile.set_key(data, key, value)
                else:
                    paramfile.delete_key(data, key)
            except paramfile.ParamsError:
                pass  # a section the rewrite does not have: nothing of it to put back


def restore_file(path: str, overrides: list[str], sources: list[bytes]) -> str | None:
    """Put `path` back to the first source that DVC's rewrite with `overrides` turns into the
    current file; else set the override keys back to the first source's values. What was
    done, or None (nothing to do)."""
    file = Path(path)
    if not file.is_file() or not sources:
        return None
    now = file.read_bytes()
    keys = [k.lstrip("+~") for k in (o.partition("=")[0] for o in overrides)]
    for source in sources:
        try:
            same = dvc_rewrite(source, path, overrides) == now
        except Exception:  # noqa: BLE001 - DVC could not replay it: this source is not the one
            same = False
        if same:
            if source != now:
                _write_bytes(file, source)
            return (f"{path}: put back byte for byte as it was before this `dvc exp run` "
                    f"(DVC had written {', '.join(keys)} into it)")
    if file.suffix not in (".yaml", ".yml"):
        return (f"{path}: DVC wrote {', '.join(keys)} into it and the file as it was could not be found; "
                f"`git diff {path}` shows the change, `git checkout -- {path}` restores the committed file")
    revert_keys(file, keys, yaml.safe_load(sources[0]) or {})
    return (f"{path}: put back {', '.join(keys)} as they were before this `dvc exp run`; DVC's rewrite also changed "
            f"the file's layout (`git diff {path}` shows it, `git checkout -- {path}` restores the committed file)")


def restore_after_exp_run(values: list[str], started: float) -> list[str]:
    """Undo DVC's -S rewrite of every file the values name; what was done, one line a file."""
    from dvc.utils.cli_parse import to_path_overrides

    head = (_git("rev-parse", "HEAD") or b"").decode().strip()
    if not values or not head:
        return []
    stashes = stash_commits(head, started)[:3]  # this run's, newest first; a replay picks it
    done = []
    for path, overrides in to_path_overrides(values).items():
        sources = [blob for rev in (*stashes, head) if (blob := _git("show", f"{rev}:./{path}")) is not None]
        line = restore_file(path, overrides, sources)
        if line:
            done.append(line)
    return done


def in_workspace_exp_run() -> bool:
    """A workspace `dvc exp run` (not --temp / --queue, which run in a scratch copy)."""
    return bool(os.environ.get("DVC_EXP_NAME")) and ".dvc/tmp/exps" not in Path.cwd().resolve().as_posix()


def restore_after_rejected_exp_run() -> tuple[list[str], list[str]]:
    """Called by the guard when it rejects the params: undo this `dvc exp run`'s -S rewrite.
    (what was done, one line a file; the dotted keys of params.yaml that the -S values set)."""
    command = exp_run_command() if in_workspace_exp_run() else None
    if not command:
        return [], []
    values, started = command
    return restore_after_exp_run(values, started), [k for k in map(override_key, values) if k]

"""Whole-or-nothing file writes, in one place: every output is written to a temporary
sibling (same folder, so the rename stays on one filesystem) and renamed over the target,
so a killed writer leaves the old file or the new one, never half of either. Standard library
only: the scoring server imports this in backend environments that share nothing else."""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def write_with(path: str | os.PathLike, write: Callable[[Path], object], keep_mode: bool = False) -> Path:
    """Call `write(tmp)` to fill a temporary sibling of `path`, then rename it over `path`.
    keep_mode: the new file gets the old one's permission bits (files a user edits)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        if keep_mode and path.exists():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():  # a writer such as save_pretrained that made a folder, then failed
            shutil.rmtree(tmp)
        elif tmp.exists():
            tmp.unlink()
    return path


def write_text(text: str, path: str | os.PathLike, keep_mode: bool = False) -> Path:
    return write_with(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), keep_mode)


def write_bytes(data: bytes, path: str | os.PathLike, keep_mode: bool = False) -> Path:
    return write_with(path, lambda tmp: tmp.write_bytes(data), keep_mode)


def replace_dir(staged: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Swap a fully written folder into place; the old folder is removed only afterwards."""
    staged, dest = Path(staged), Path(dest)
    old = dest.with_name(f".{dest.name}.old{os.getpid()}")
    if dest.exists():
        os.replace(dest, old)
    os.replace(staged, dest)
    if old.exists():
        shutil.rmtree(old)
    return dest

"""Cheap integrity checks of the files a stage reads, with errors that name the file and the fix.

Standard library only, so params.yaml validation runs them in milliseconds before any
stage does work (and before DVC deletes outputs): a truncated safetensors file or a torch
checkpoint cut short by a killed writer is reported as that file, not as a bare
"OSError: [Errno 22]" from deep inside a loader.

- safetensors: 8-byte little-endian header length N, an N-byte JSON header whose tensors'
  data_offsets end exactly at the end of the file.
- torch checkpoints (torch.save's zip format): a readable zip whose members' CRCs match.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile
from pathlib import Path

SAFETENSORS_NAME = "diffusion_pytorch_model.safetensors"  # what save_pretrained writes


class CorruptFileError(ValueError):
    """A file that exists but cannot be what it claims to be; the message names it."""


def check_safetensors(path: str | os.PathLike, fix: str) -> None:
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CorruptFileError(f"{path}: {size} bytes, too short for a safetensors file\n    fix: {fix}")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise CorruptFileError(f"{path}: header claims {n} bytes but the file has {size}; "
                                   f"the file is truncated\n    fix: {fix}")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CorruptFileError(f"{path}: unreadable safetensors header\n    fix: {fix}") from None
    ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
    if 8 + n + max(ends, default=0) != size:
        raise CorruptFileError(f"{path}: tensors end at byte {8 + n + max(ends, default=0)} but the "
                               f"file has {size} bytes; the file is truncated or padded\n    fix: {fix}")


def check_torch_zip(path: str | os.PathLike, fix: str) -> None:
    """A torch.save file (zip format): readable, and every member's CRC matches."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CorruptFileError(f"{path}: not a complete torch checkpoint ({exc})\n    fix: {fix}") from None
    if bad is not None:
        raise CorruptFileError(f"{path}: member {bad} is corrupt (CRC mismatch)\n    fix: {fix}")


def read_json_file(path: str | os.PathLike, fix: str) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise CorruptFileError(f"{path}: not UTF-8 text\n    fix: {fix}") from None
    except json.JSONDecodeError as exc:
        raise CorruptFileError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})\n    fix: {fix}") from None
    if not isinstance(data, dict):
        raise CorruptFileError(f"{path}: a JSON {type(data).__name__}, expected an object\n    fix: {fix}")
    return data


def check_model_dir(path: str | os.PathLike, fix: str) -> dict:
    """A save_pretrained folder: config.json (returned) and intact safetensors weights.
    FileNotFoundError / CorruptFileError name the path and end with `fix`."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such folder\n    fix: {fix}")
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{path}: no config.json, so not a saved model\n    fix: {fix}")
    config = read_json_file(cfg, fix)
    weights = path / SAFETENSORS_NAME
    if not weights.is_file():
        raise FileNotFoundError(f"{path}: no {SAFETENSORS_NAME}\n    fix: {fix}")
    check_safetensors(weights, fix)
    return config

"""JSON-lines files, read and written in one place (prompt sets, scorer batches, results).

One JSON object per line, UTF-8. A file that cannot be read names itself and the line:
    prompts/world_train.jsonl:17: not valid JSON (Expecting ',' delimiter: column 12)
so a hand-edited or truncated prompt file is fixed in one look. Blank lines are skipped.
Writes go to a temporary file in the same folder and are renamed into place, so a killed
writer never leaves half a file behind. Standard library only: the scoring server imports
this in backend environments that share nothing else with the core.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from margrpo.atomic import write_text


class JsonlError(ValueError):
    """A JSON-lines file that cannot be read; the message names the file and the line."""


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; JsonlError naming file:line for a bad line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise JsonlError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); "
                         "save the file as UTF-8") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonlError(f"{path}:{number}: not valid JSON ({exc.msg}: column {exc.colno}); "
                             "each line must be one JSON object") from None
        if not isinstance(row, dict):
            raise JsonlError(f"{path}:{number}: a JSON {type(row).__name__}, expected an object {{...}}")
        rows.append(row)
    return rows


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write rows, one JSON object per line, atomically (temporary file, then rename)."""
    write_text("".join(json.dumps(row) + "\n" for row in rows), path)

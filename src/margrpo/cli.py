"""The command line every script shares: `--params FILE` and repeatable `-S key=value`
(the same dotted overrides as `dvc exp run -S`), parsed once into a validated Params."""
from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from typing import Any

from margrpo.config import Params, load_params, parse_overrides


def script_parser(doc: str | None, overrides_help: str = "dotted key=value, as in `dvc exp run -S`") -> argparse.ArgumentParser:
    """An ArgumentParser described by the first line of `doc`, with --params and -S."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    ap.add_argument("--params", default="params.yaml", help="the params file (default params.yaml)")
    ap.add_argument("-S", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=overrides_help)
    return ap


def params_from_args(args: argparse.Namespace, *, before: Iterable[str] = (), after: Iterable[str] = (),
                     fixed: Mapping[str, Any] | None = None) -> Params:
    """Params of `args.params` with overrides applied in order: `before` (a script's own
    defaults, which -S may change), the user's -S, `after`, then `fixed` (values the script
    needs whatever -S says)."""
    items = [*before, *args.overrides, *after]
    return load_params(args.params, parse_overrides(items) | dict(fixed or {}))

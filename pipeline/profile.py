"""Params profiles: a partial params file (e.g. params_quick.yaml) as overrides.

    dvc exp run $(python -m pipeline.profile params_quick.yaml)    # -S flags, one experiment
    python -m pipeline.profile params_quick.yaml --apply           # merge into params.yaml

The profile is validated together with params.yaml before anything runs.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def flatten(tree: dict, prefix: str = "") -> dict:
    """Dotted keys down to the leaves; lists stay whole (DVC sets them as one value)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def set_flags(profile: dict) -> list[str]:
    """-S key=value pairs with compact JSON values: no spaces or quotes, so the output can
    be spliced unquoted into a command line with $(...)."""
    flags = []
    for key, value in flatten(profile).items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        if any(c in text for c in " '\"\\"):
            raise SystemExit(f"{key}: value {text} cannot be passed unquoted; use --apply instead")
        flags += ["-S", f"{key}={text}"]
    return flags


def main(argv: list[str] | None = None) -> None:
    from margrpo.config import parse_params

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--apply", action="store_true", help="write the merged params into --params")
    args = ap.parse_args(argv)
    base = yaml.safe_load(args.params.read_text()) or {}
    profile = yaml.safe_load(args.profile.read_text()) or {}
    merged = merge(base, profile)
    parse_params(merged, f"{args.params} + {args.profile}")
    if args.apply:
        args.params.write_text(yaml.safe_dump(merged, sort_keys=False))
    else:
        sys.stdout.write(" ".join(set_flags(profile)) + "\n")


if __name__ == "__main__":
    main()

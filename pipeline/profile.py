"""Params profiles: a partial params file (e.g. params_quick.yaml) as overrides.

    python -m pipeline.quick                                      # the quick profile, as a --temp experiment
    dvc exp run --temp $(python -m pipeline.profile params_quick.yaml)   # the same, by hand
    python -m pipeline.profile params_quick.yaml --apply          # merge into params.yaml (asked for)

Without --apply nothing is written: the -S flags go to `dvc exp run`, whose `--temp` runs
in a scratch copy and leaves params.yaml and the committed reports alone (a plain
`dvc exp run` would write the profile and its results into the workspace). --apply keeps
params.yaml's comments and layout (DVC's round-trip YAML writer). The profile is validated
together with params.yaml before anything runs.
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


def merged_params(profile_path: Path, params_path: Path = Path("params.yaml")):
    """(profile dict, validated Params of params.yaml + profile); ParamsError names the key."""
    from margrpo.config import parse_params

    base = yaml.safe_load(params_path.read_text()) or {}
    profile = yaml.safe_load(profile_path.read_text()) or {}
    return profile, parse_params(merge(base, profile), f"{params_path} + {profile_path}")


def apply(profile: dict, params_path: Path) -> None:
    from dvc.utils.serialize import modify_yaml

    from margrpo import paramfile

    with modify_yaml(params_path) as data:
        for key, value in flatten(profile).items():
            paramfile.set_key(data, key, value, str(params_path))


def main(argv: list[str] | None = None) -> None:
    from margrpo.config import ParamsError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    ap.add_argument("--apply", action="store_true", help="write the merged params into --params")
    args = ap.parse_args(argv)
    try:
        profile, _ = merged_params(args.profile, args.params)
    except ParamsError as err:
        raise SystemExit(str(err)) from None
    if args.apply:
        apply(profile, args.params)
    else:
        sys.stdout.write(" ".join(set_flags(profile)) + "\n")


if __name__ == "__main__":
    main()

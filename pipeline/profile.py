"""Params profiles: a partial params file (e.g. params_quick.yaml) as overrides.

    python -m pipeline.quick                                      # the quick profile, as a --temp experiment
    dvc exp run --temp $(python -m pipeline.profile params_quick.yaml)   # the same, by hand
    python -m pipeline.profile params_quick.yaml --apply          # merge into params.yaml (asked for)
    python -m pipeline.profile params_gpu.yaml --out merged.yaml  # params.yaml + profile into a new file

Without --apply or --out nothing is written: the -S flags go to `dvc exp run`, whose `--temp`
runs in a scratch copy and leaves params.yaml and the committed reports alone (a plain
`dvc exp run` would write the profile and its results into the workspace). --apply keeps
params.yaml's comments and layout (DVC's round-trip YAML writer, so it needs DVC). --out
writes the merged params as plain YAML (comments dropped) and needs neither DVC nor the
pipeline's other packages: scripts/gpu_check.sh uses it on a machine that has PyTorch and
the model's packages only. The profile is validated together with params.yaml before
anything is written.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import yaml

from margrpo import paramfile


def flatten(tree: dict, prefix: str = "") -> dict:
    """Dotted keys down to the leaves; lists stay whole (DVC sets them as one value)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def set_leaves(tree, profile: dict, source: str) -> None:
    """Every leaf of the profile set in `tree` (a plain or round-trip YAML tree), in place,
    through paramfile's dotted-key walker: missing sections are created, lists are
    replaced whole, and a key that runs into a value names itself (ParamsError)."""
    for key, value in flatten(profile).items():
        paramfile.set_key(tree, key, value, source)


def merge(base: dict, profile: dict, source: str = "params.yaml") -> dict:
    """A copy of `base` with the profile's leaves set (the same merge as --apply and --out)."""
    out = copy.deepcopy(base)
    set_leaves(out, profile, source)
    return out


def set_flags(profile: dict) -> list[str]:
    """-S key=value pairs with compact JSON values: no spaces or quotes, so the output can
    be spliced unquoted into a command line with $(...)."""
    flags = []
    for key, value in flatten(profile).items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        if any(c in text for c in " '\"\\"):
            raise SystemExit(f"{key}: value {text} cannot be passed unquoted; use --apply or --out instead")
        flags += ["-S", f"{key}={text}"]
    return flags


def read_pair(profile_path: Path, params_path: Path) -> tuple[dict, dict]:
    """(params file tree, profile tree) as plain YAML."""
    base = yaml.safe_load(params_path.read_text()) or {}
    profile = yaml.safe_load(profile_path.read_text()) or {}
    return base, profile


def merged_params(profile_path: Path, params_path: Path = Path("params.yaml")):
    """(profile dict, validated Params of params.yaml + profile); ParamsError names the key."""
    from margrpo.config import parse_params

    base, profile = read_pair(profile_path, params_path)
    return profile, parse_params(merge(base, profile, str(params_path)), f"{params_path} + {profile_path}")


def apply(profile: dict, params_path: Path) -> None:
    """Write the profile into params_path in place, keeping its comments (DVC's writer)."""
    try:
        from dvc.utils.serialize import modify_yaml
    except ImportError:
        raise SystemExit(f"--apply keeps the comments of {params_path} with DVC's round-trip YAML writer, and DVC "
                         "is not installed in this Python; install the project (pip install -e .), or write the "
                         "merged params to another file with --out FILE (plain YAML, no DVC needed)") from None
    with modify_yaml(params_path) as data:
        set_leaves(data, profile, str(params_path))


def write_merged(profile_path: Path, params_path: Path, out: Path) -> None:
    """params_path + profile as plain YAML in `out` (validated by the caller)."""
    base, profile = read_pair(profile_path, params_path)
    merged = merge(base, profile, str(params_path))
    header = f"# {params_path} + {profile_path}, merged by pipeline/profile.py (comments of both dropped)\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump(merged, sort_keys=False, allow_unicode=True))


def main(argv: list[str] | None = None) -> None:
    from margrpo.config import ParamsError

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", type=Path)
    ap.add_argument("--params", type=Path, default=Path("params.yaml"))
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--apply", action="store_true", help="write the merged params into --params (needs DVC)")
    mode.add_argument("--out", type=Path, help="write the merged params to this file (plain YAML, no DVC)")
    args = ap.parse_args(argv)
    try:
        profile, _ = merged_params(args.profile, args.params)
    except ParamsError as err:
        raise SystemExit(str(err)) from None
    if args.apply:
        apply(profile, args.params)
    elif args.out:
        write_merged(args.profile, args.params, args.out)
    else:
        sys.stdout.write(" ".join(set_flags(profile)) + "\n")


if __name__ == "__main__":
    main()

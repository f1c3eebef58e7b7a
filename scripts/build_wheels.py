"""Build the wheel folder that scripts/gpu_check.sh installs on a machine with PyTorch and no network.

    .venv/bin/python scripts/build_wheels.py [--dest outputs/wheels] [--python-version 3.12 ...] [--glibc 2.28]
    .venv/bin/python scripts/build_wheels.py --print-requirements

The requirements are pyproject.toml's, at its pins: `dependencies` and the `dev` extra, less
torch (the GPU machine's own CUDA build is used) and less the study's orchestration and
figure packages (dvc, mlflow, prefect, matplotlib), which the check never imports. Their
dependencies are resolved by pip as on a machine that has PyTorch and nothing else: a venv
holding only torch (.venvs/torch-only, made here from the CPU wheel pyproject pins) answers
`pip install --dry-run --report`, so torch and what it needs count as present and no CUDA
wheel is fetched. The versions installed in the Python running this script (the project's
.venv, the versions the test suite passes with) are constraints, unless --no-pin-installed.

Writes DEST/*.whl (one version of each package: binary wheels for every --python-version,
manylinux x86_64 up to glibc --glibc), DEST/requirements.txt (what gpu_check.sh installs:
`pip install --no-index --find-links DEST -r DEST/requirements.txt`) and DEST/MANIFEST.txt
(per Python version, name==version of every wheel). Then, on the GPU machine:
`bash scripts/gpu_check.sh --wheels DEST`.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESOLVER = ROOT / ".venvs" / "torch-only"
# Packages of pyproject the GPU check does not import; each pulls tens of others (dvc ~60,
# mlflow ~50) that would make the folder too large to carry.
NOT_NEEDED = {"dvc", "mlflow", "prefect", "matplotlib"}
# What a machine with PyTorch has: torch (its own build) and, in the resolver venv, its needs.
PRESENT = "torch"


def _packaging():
    try:
        from packaging import markers, requirements, utils
    except ImportError:  # pip vendors the same library
        from pip._vendor.packaging import markers, requirements, utils
    return requirements.Requirement, utils.canonicalize_name, markers.default_environment


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise SystemExit("reading pyproject.toml needs Python 3.11+ (tomllib) or the tomli package") from None
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    """The canonical project name of a requirement line (PEP 503), with the standard library
    only, so that gpu_check.sh can print the pins on a machine that has nothing else."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise SystemExit(f"pyproject.toml: cannot read the requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements() -> list[str]:
    """pyproject's dependencies + dev extra, as written there, without torch and NOT_NEEDED."""
    project = _pyproject()["project"]
    out, seen = [], set()
    for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
        name = _name(line)
        if name == PRESENT or name in NOT_NEEDED or name in seen:
            continue
        seen.add(name)
        out.append(line)
    return out


def torch_pin() -> str:
    """The CPU wheel of pyproject's torch pin (torch==X -> torch==X+cpu): the resolver's torch."""
    Requirement, canon, _ = _packaging()
    for line in _pyproject()["project"]["dependencies"]:
        req = Requirement(line)
        if canon(req.name) == PRESENT:
            (spec,) = req.specifier
            return f"torch=={spec.version}+cpu" if spec.operator == "==" else line
    raise SystemExit("pyproject.toml lists no torch dependency")


def pip(python: Path | str, *args: str) -> str:
    cmd = [str(python), "-m", "pip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd[:8])} ...")
    return done.stdout


def installed(python: Path) -> dict[str, dict]:
    """{canonical name: metadata dict} of what `python`'s environment holds (pip inspect)."""
    _, canon, _ = _packaging()
    report = json.loads(pip(sys.executable, "--python", str(python), "inspect"))
    return {canon(d["metadata"]["name"]): d["metadata"] for d in report["installed"]}


def needs(meta: dict, env: dict, extras: set[str]) -> list:
    """The Requirements of one distribution that apply in `env` with `extras` asked for."""
    Requirement, _, _ = _packaging()
    out = []
    for line in meta.get("requires_dist") or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def resolver_venv(torch_spec: str) -> tuple[Path, dict[str, dict]]:
    """.venvs/torch-only (made with this Python) and what it holds: torch and its needs only
    (checked, so that nothing else in it hides a requirement from the resolution)."""
    py = RESOLVER / "bin" / "python"
    if not py.exists():
        print(f"making {RESOLVER} ({torch_spec})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(RESOLVER)], check=True)
        pip(py, "install", "--quiet", torch_spec)
    have = installed(py)
    torch_closure = closure([PRESENT], {}, have, _packaging()[2](), skip=set())
    extra = set(have) - torch_closure - {"pip", "setuptools", "wheel"}
    if PRESENT not in have or extra:
        raise SystemExit(f"{RESOLVER} must hold torch and its needs only (it has {sorted(extra) or 'no torch'}); "
                         f"delete it and run again")
    return py, have


def closure(roots: list[str], resolved: dict, have: dict, env: dict, skip: set[str]) -> set[str]:
    """Canonical names of `roots` and all they need in `env` (resolved first, then installed
    metadata), not descending into `skip`."""
    Requirement, canon, _ = _packaging()
    todo = [Requirement(r) for r in roots]
    seen: dict[str, set[str]] = {}
    while todo:
        req = todo.pop()
        name = canon(req.name)
        if name in skip:
            continue
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen[name] = seen.get(name, set()) | extras
        meta = resolved.get(name) or have.get(name)
        if meta is None:
            raise SystemExit(f"{name} (needed by the requirements) was neither resolved nor installed; "
                             "the resolution and this walk disagree on a marker")
        todo.extend(needs(meta, env, seen[name]))
    return set(seen)


def platforms(glibc: str) -> list[str]:
    """--platform flags: every manylinux tag a glibc-`glibc` x86_64 machine accepts (pip matches tags exactly)."""
    top = int(glibc.split(".")[1])
    tags = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    tags += [f"manylinux_2_{n}_x86_64" for n in range(5, top + 1)]
    return [a for t in tags for a in ("--platform", t)]


def installed_pins() -> list[str]:
    """name==version of this Python's packages (the project's tested versions), torch and
    local builds left out."""
    _, canon, _ = _packaging()
    out = set()
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and "+" not in version and canon(name) not in {PRESENT, "margrpo"}:
            out.add(f"{canon(name)}=={version}")
    return sorted(out)


def _has(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def build(dest: Path, versions: list[str], glibc: str, pin_installed: bool, omit: set[str]) -> None:
    _, canon, _ = _packaging()
    roots = requirements()
    resolver, have = resolver_venv(torch_pin())
    pins = installed_pins() if pin_installed else []
    if pin_installed and not _has("margrpo"):
        print("note: this Python has no margrpo installed; its packages are used as constraints all the same "
              "(run with the project's .venv/bin/python, or pass --no-pin-installed)", flush=True)
    dest.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        reqfile, consfile, report_path = Path(tmp, "req.txt"), Path(tmp, "cons.txt"), Path(tmp, "report.json")
        reqfile.write_text("\n".join(roots) + "\n")
        consfile.write_text("\n".join(pins) + "\n")
        for v in versions:
            target = ["--only-binary=:all:", "--python-version", v, "--implementation", "cp", *platforms(glibc)]
            print(f"resolving for Python {v} as on a machine with only torch", flush=True)
            pip(sys.executable, "--python", str(resolver), "install", "--dry-run", "--quiet", "--report",
                str(report_path), *target, "-r", str(reqfile), "-c", str(consfile))
            report = json.loads(report_path.read_text())
            resolved = {canon(d["metadata"]["name"]): d["metadata"] for d in report["install"]}
            names = closure(roots, resolved, have, report["environment"], skip={PRESENT} | omit)
            wanted = sorted(f"{n}=={(resolved.get(n) or have[n])['version']}" for n in names)
            print(f"downloading {len(wanted)} wheels for Python {v}", flush=True)
            pip(sys.executable, "download", "--no-deps", "--quiet", *target, "-d", str(dest), *wanted)
            manifest[v] = wanted
    files = {p.name for p in dest.glob("*.whl")}
    kept = set()
    for v, wanted in manifest.items():
        for spec in wanted:
            name, version = spec.split("==")
            kept |= {f for f in files if canon(f.split("-")[0]) == name and f.split("-")[1] == version}
    for stale in files - kept:  # an earlier build's other versions: one version of each stays
        (dest / stale).unlink()
    (dest / "requirements.txt").write_text("\n".join(roots) + "\n")
    (dest / "MANIFEST.txt").write_text("".join(f"# Python {v}\n" + "\n".join(w) + "\n" for v, w in manifest.items()))
    size = sum(p.stat().st_size for p in dest.glob("*.whl")) / 2**20
    print(f"{dest}: {len(kept)} wheels, {size:.1f} MiB, for Python {', '.join(versions)}; "
          f"on the GPU machine: bash scripts/gpu_check.sh --wheels {dest}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=ROOT / "outputs" / "wheels", help="default outputs/wheels (git-ignored)")
    ap.add_argument("--python-version", action="append", dest="versions",
                    help="target Python, e.g. 3.12 (repeat for several; default: this Python's)")
    ap.add_argument("--glibc", default="2.28", help="the target's glibc: newest manylinux tag accepted (default 2.28)")
    ap.add_argument("--no-pin-installed", action="store_true",
                    help="resolve freely within pyproject's ranges instead of this Python's installed versions")
    ap.add_argument("--omit", default="", help="comma-separated packages the target already has, left out with "
                    "what only they need (smaller folder; pip on the target then uses the installed ones)")
    ap.add_argument("--print-requirements", action="store_true", help="print the requirements and exit")
    a = ap.parse_args()
    if a.print_requirements:
        print("\n".join(requirements()))
        return
    if not (a.dest / "MANIFEST.txt").exists() and any(a.dest.glob("*.whl")):
        raise SystemExit(f"{a.dest} holds wheels this script did not write (no MANIFEST.txt); choose an empty --dest")
    omit = {_name(n) for n in a.omit.split(",") if n.strip()}
    build(a.dest, a.versions or ["{}.{}".format(*sys.version_info[:2])], a.glibc, not a.no_pin_installed, omit)


if __name__ == "__main__":
    main()

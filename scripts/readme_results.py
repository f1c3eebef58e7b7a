"""Write the README's results table and claims line from the committed study (reports/), or check it.

    .venv/bin/python scripts/readme_results.py          # rewrite the block in README.md
    .venv/bin/python scripts/readme_results.py --check  # exit 1 when README.md is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from margrpo.config import load_params
from margrpo.report.readme import claims_line, replace_block, results_table

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when the README differs")
    args = ap.parse_args()
    params = load_params(ROOT / "params.yaml")
    table = results_table(ROOT / "reports", ["base", *params.methods])
    if line := claims_line(ROOT / "reports"):
        table = f"{table}\n\n{line}"
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = replace_block(text, table)
    if args.check:
        if new != text:
            print("README.md's results table differs from reports/: run python scripts/readme_results.py")
            return 1
        print("README.md's results table matches reports/")
        return 0
    readme.write_text(new)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

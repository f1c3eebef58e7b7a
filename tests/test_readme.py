"""The README's results table is written from the committed study and must match it."""
import subprocess
import sys
from pathlib import Path

import pytest

from margrpo.report.readme import END, START, replace_block

REPO = Path(__file__).resolve().parents[1]


def test_results_table_matches_reports():
    proc = subprocess.run([sys.executable, "scripts/readme_results.py", "--check"], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_replace_block():
    text = f"intro\n{START}\nold\n{END}\noutro\n"
    assert replace_block(text, "| a |") == f"intro\n{START}\n| a |\n{END}\noutro\n"
    with pytest.raises(ValueError, match="results:start"):
        replace_block("no markers", "| a |")

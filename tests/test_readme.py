"""The README's results table is written from the committed study and must match it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from margrpo.report.readme import END, START, claims_line, replace_block

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


def test_claims_line_groups_summary_codes_by_verdict(tmp_path):
    assert claims_line(tmp_path) == ""  # no summary.json: no line
    (tmp_path / "summary.json").write_text(json.dumps({"claims": {"claim10": 0, "claim2": 1, "claim1": -1,
                                                                  "claim4": 2, "claim3": 0, "claim5": None,
                                                                  "note": 1}}))
    assert claims_line(tmp_path) == ("Claims of the paper (method.md §6) in the report's claims table: holds: 2; "
                                     "no difference larger than δ: 4; inconclusive: 3, 10; does not hold: 1.")

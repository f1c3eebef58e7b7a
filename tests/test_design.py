"""The committed study design (study_design.yaml) and the seeds it asks for."""
from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from margrpo.report import design as study_design
from margrpo.report.inference import ALPHA, power

ROOT = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((ROOT / study_design.DESIGN_FILE).read_text())


def test_the_committed_design_parses_and_names_every_claim():
    d = study_design.parse(RAW)
    assert d.alpha == ALPHA and d.power == 0.8 and set(d.claims) == {1, 2, 3, 4, 5, 6}
    assert d.claims[4].best and not d.claims[5].best and len(d.claims[5].parts) == 10
    c = d.pilot["eval/geneval/overall"]
    trained, base = d.part(5, "geneval/overall-grpo"), d.part(5, "geneval/overall-base")
    # paired difference of two trained methods: 2 (sigma_t^2 + sigma_e^2); against the base: sigma_t^2 + 2 sigma_e^2
    assert trained.sd == pytest.approx(math.sqrt(2 * (c.sigma_t ** 2 + c.sigma_e ** 2)))
    assert base.sd == pytest.approx(math.sqrt(c.sigma_t ** 2 + 2 * c.sigma_e ** 2))
    assert d.part(1, "kl_growth").design == "one-sample" and d.part(9, "x") is None


def test_claim_seeds_give_the_target_power():
    d = study_design.parse(RAW)
    for c in d.claims.values():
        n = c.seeds(d.power)
        assert n is not None and c.power(n) >= d.power > c.power(n - 1)
        assert c.power(n) <= min(float(power(p.effect, p.sd, n, design=p.design)) for p in c.parts.values())


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["claims"][3]["parts"]["reward"].update(effect=0.005), "effect 0.005 must exceed delta"),
    (lambda r: r["claims"][3]["parts"]["t2i/mean"].update(metric="eval/t2i/colour"), "no components"),
    (lambda r: r["claims"][1]["parts"]["kl_growth"].update(design="unpaired"), r"claims\.1\.parts\.kl_growth\.design"),
    (lambda r: r["claims"][2]["parts"]["final_kl"].pop("sd"), r"claims\.2\.parts\.final_kl has no 'sd'"),
    (lambda r: r.update(alpha=0.05), "tests run at 0.025"),
])
def test_errors_name_the_key(edit, message):
    raw = copy.deepcopy(RAW)
    edit(raw)
    with pytest.raises(ValueError, match=message):
        study_design.parse(raw)


def test_design_seeds_script_prints_every_claim():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "design_seeds.py"), "--seeds", "5"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "power stated at 5 seeds" in out
    assert sum("= claim" in line for line in out.splitlines()) == 6

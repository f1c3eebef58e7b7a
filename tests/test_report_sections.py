"""The report's score tables with intervals, the reward-vs-judge and consistency-filter
sections, the summary's held-out line, and the acceptance table on partial records."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from margrpo.report import summary as summary_text
from margrpo.report.checks import consistency_section, consistency_summary, judge_section
from margrpo.report.score_tables import best_section, headline, novel_section, prompt_counts_line, scores_table

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [{"prompt": "a red circle", "tag": "colors", "category": "color", "subset": "test"},
           {"prompt": "a blue square", "tag": "colors", "category": "color", "subset": "test"},
           {"prompt": "two circles", "tag": "counting", "category": "numeracy", "subset": "test"},
           {"prompt": "three squares", "tag": "counting", "category": "numeracy", "subset": "unseen_tag"},
           {"prompt": "a green cube", "tag": "colors", "category": "color", "subset": "novel"},
           {"prompt": "a red cube", "tag": "colors", "category": "color", "subset": "novel"}]


def _pp(level: float, seeds=("0", "1", "2"), best: float | None = None, novel: bool = True) -> dict:
    prompts = PROMPTS if novel else PROMPTS[:4]

    def scores(lv, s):
        v = [lv + 0.1 * (i % 2) + 0.01 * int(s) for i in range(len(prompts))]
        return {"geneval": v, "t2i": v, "proxy_geneval": v, "proxy_t2i": v}

    return {"images_per_prompt": 2, "prompts": prompts, "final": {s: scores(level, s) for s in seeds},
            "best": {} if best is None else {s: scores(best, s) for s in seeds}}


def _metrics(overall: float) -> dict:
    keys = {"eval/geneval/overall": overall, "eval/geneval/colors": overall, "eval/t2i/mean": overall,
            "eval/partial": 0.6}
    return {"mean": keys, "std": {k: 0.01 for k in keys}}


def test_scores_table_has_intervals_and_paired_gains_only_with_per_prompt_scores():
    evals = {"base": _metrics(0.4), "grpo": _metrics(0.5)}
    table = scores_table(evals, {"base": _pp(0.4), "grpo": _pp(0.5)}, ["base", "grpo"])
    rows = {r[0]: r[1:] for r in table.rows}
    assert rows["eval/geneval/overall"][1].startswith("0.560 [")  # the per-prompt statistic (+0.05 prompt, +0.01 seed)
    assert rows["eval/partial"] == ["0.600 ± 0.010", "0.600 ± 0.010"]  # no per-prompt scores: mean ± std
    assert rows["gain vs base: eval/geneval/overall"] == ["–", "+0.100 [+0.100, +0.100]"]
    old = {r[0]: r[1:] for r in scores_table(evals, {}, ["base", "grpo"]).rows}
    assert old["eval/geneval/overall"] == ["0.400 ± 0.010", "0.500 ± 0.010"]
    assert not any(k.startswith("gain") for k in old)


def test_headline_summary_keys():
    evals = {"base": _metrics(0.4), "grpo": _metrics(0.5), "mar_grpo": _metrics(0.45)}
    # mar_grpo has no per_prompt.json (an older record): its numbers come from metrics.json
    h = headline(evals, {"base": _pp(0.4), "grpo": _pp(0.5, seeds=("0", "1"))}, ["base", "grpo", "mar_grpo"])
    assert set(h) == {"overall", "t2i", "partial", "gain", "overall_ci", "gain_ci", "novel"}
    assert h["overall"]["base"] == pytest.approx(0.46) and h["overall"]["mar_grpo"] == 0.45
    assert h["gain"]["grpo"] == pytest.approx(0.1)  # paired on the two common seeds
    assert h["gain"]["mar_grpo"] == pytest.approx(0.45 - 0.46)
    assert set(h["overall_ci"]) == {"base", "grpo"} and set(h["gain_ci"]) == {"grpo"}
    low, high = h["overall_ci"]["base"]
    assert low <= h["overall"]["base"] <= high
    assert h["novel"]["grpo"] == pytest.approx(0.555) and h["partial"]["base"] == 0.6
    plain = headline(evals, {}, ["base", "grpo", "mar_grpo"])
    assert plain["overall_ci"] == plain["gain_ci"] == plain["novel"] == {}
    assert plain["gain"]["grpo"] == pytest.approx(0.1)


def test_novel_section_and_prompt_counts():
    per_prompt = {"base": _pp(0.4), "grpo": _pp(0.5)}
    section = novel_section(per_prompt, ["grpo", "mar_grpo"])
    rows = {r[0]: r[1:] for r in section.tables[0].rows}
    assert rows["base"][1] == "–" and rows["grpo"][1] == "+0.100 [+0.100, +0.100]"
    assert rows["mar_grpo"] == ["–"] * 4  # not evaluated with per-prompt scores
    assert novel_section({"base": _pp(0.4, novel=False)}, ["grpo"]) is None
    line = prompt_counts_line(per_prompt)
    assert "test: 3 (color 2, colors 2, counting 1, numeracy 1)" in line and "unseen_tag: 1" in line
    assert "novel: 2" in line and "2 images per prompt" in line
    assert prompt_counts_line({}) is None


def test_best_section_falls_back_to_per_seed_records(tmp_path):
    (tmp_path / "eval" / "grpo").mkdir(parents=True)
    best = {s: {"eval/geneval/overall": 0.5 + 0.01 * i} for i, s in enumerate("012")}
    (tmp_path / "eval" / "grpo" / "per_seed_best.json").write_text(json.dumps(best))
    per_seed = {t: {s: {"eval/geneval/overall": v} for s in "012"} for t, v in (("base", 0.4), ("grpo", 0.5))}
    rows = best_section(tmp_path, per_seed, {"base": _pp(0.4), "grpo": _pp(0.5)}, ["grpo"]).tables[0].rows
    # final from the per-prompt scores; best has none in per_prompt.json: per-seed mean ± std
    assert rows[0][1].startswith("0.560 [") and rows[0][2] == "+0.100 [+0.100, +0.100]"
    assert rows[0][3] == "0.510 ± 0.010" and rows[0][4] == "0.110 ± 0.010"
    with_best = best_section(tmp_path, per_seed, {"base": _pp(0.4), "grpo": _pp(0.5, best=0.55)}, ["grpo"])
    assert with_best.tables[0].rows[0][4] == "+0.150 [+0.150, +0.150]"


def test_summary_is_one_line_per_method():
    per_prompt = {"base": _pp(0.4), "grpo": _pp(0.5), "mar_grpo": _pp(0.41)}
    stats = {"grpo": {"final": {"reward/mean": [0.5, 0.6]}, "growth": {"reward/mean": [0.1, 0.2]}}}
    lines = summary_text.method_lines(per_prompt, {}, stats, ["grpo", "mar_grpo"])
    assert len(lines) == 3 and lines[0].startswith("base: test GenEval overall 0.460 [")
    assert lines[1].startswith("grpo: test GenEval overall 0.560 [0.535, 0.585]; gain over base +0.100 "
                               "[+0.100, +0.100] better; T2I mean gain")
    assert lines[1].endswith("; training reward 0.550 (+0.150 from the early window).")
    assert "gain over base +0.010 [+0.010, +0.010] better" in lines[2]  # above 0 wins over "within ±δ"
    # control: without per-prompt scores the per-seed values, paired by seed
    plain = summary_text.method_lines({}, {"base": {"eval/geneval/overall": [0.4, 0.41, 0.39]},
                                           "grpo": {"eval/geneval/overall": [0.5, 0.52, 0.49]}}, {}, ["grpo"])
    assert plain[0] == "base: test GenEval overall 0.400 (mean [95% t-interval over seeds], final checkpoints)."
    assert "gain over base +0.103 [" in plain[1] and "T2I mean gain not measured" in plain[1]


def _history(n: int, judge: bool = True, consistency: bool = False, offset: float = 0.0) -> list[dict]:
    rows = []
    for i in range(n):
        r = {"step": i + 1, "reward/mean": 0.4 + 0.01 * i}
        if judge:
            r.update({"judge/correct": 0.4, "judge/proxy_correct": 0.4 + 0.01 * i})
        if consistency:
            r.update({"select/consistency_kept_tau-1": 0.9 + offset, "select/consistency_kept_tau0.5": 0.3,
                      "select/consistency_kept_tau0": 0.6, "select/consistency_score_q50": 0.2 + 0.02 * i,
                      "select/consistency_score_q10": -0.1})
        rows.append(r)
    return rows


def _evals(proxy_gain: float, judge_gain: float, jitter: float) -> list[dict]:
    return [{"step": 0, "eval/geneval/colors": 0.5, "eval/proxy/geneval/colors": 0.5},
            {"step": 10, "eval/geneval/colors": 0.5 + judge_gain,
             "eval/proxy/geneval/colors": 0.5 + proxy_gain + jitter}]


def test_judge_section_draws_and_flags_only_with_the_new_keys(tmp_path):
    histories = {"grpo": {s: _history(6) for s in (0, 1)}, "mar_grpo": {0: _history(6, judge=False)}}
    evals = {"grpo": {s: _evals(0.2, -0.1, 0.01 * s) for s in (0, 1, 2)}, "mar_grpo": {0: _evals(0.0, 0.0, 0.0)}}
    section = judge_section(histories, evals, tmp_path)
    assert section.figures and section.figures[0].path.exists()
    rows = section.tables[0].rows
    assert [r[:2] for r in rows] == [["grpo", "colors"], ["mar_grpo", "colors"]]
    assert rows[0][-1] == "reward hacking" and rows[1][-1] == "–" and rows[1][2] == "+0.000 (one seed)"
    old_histories = {"grpo": {0: _history(6, judge=False)}}
    old_evals = {"grpo": {0: [{"step": 0, "eval/geneval/colors": 0.5}, {"step": 10, "eval/geneval/colors": 0.4}]}}
    assert judge_section(old_histories, old_evals, tmp_path / "old") is None
    assert not (tmp_path / "old" / "reward_vs_judge.png").exists()


def test_consistency_filter_table():
    histories = {0: _history(3, consistency=True), 1: _history(3, consistency=True, offset=0.02)}
    s = consistency_summary(histories)
    assert s["select/consistency_kept_tau-1"][0] == pytest.approx(0.91)  # mean over steps, then seeds
    assert s["select/consistency_score_q50"][0] == pytest.approx(0.22) and s["select/consistency_score_q50"][2] == 2
    assert "reward/mean" not in s
    section = consistency_section({"grpo_frozen_spec": histories, "grpo": {0: _history(3)}})
    table = section.tables[0]
    assert table.header == ["method", "kept, tau -1", "kept, tau 0", "kept, tau 0.5", "score q10", "score q50"]
    assert [r[0] for r in table.rows] == ["grpo_frozen_spec"] and table.rows[0][1] == "0.910 ± 0.014"
    assert consistency_section({"grpo": {0: _history(3)}}) is None


def _write_study(reports: Path, methods: dict[str, list[str]]) -> None:
    """A minimal study record: base and each method's per_seed(_best).json, per_prompt.json
    and 20-step histories for the given seeds."""
    for target, seeds in {"base": ["0", "1", "2"], **methods}.items():
        level = 0.4 if target == "base" else 0.5
        out = reports / "eval" / target
        out.mkdir(parents=True)
        per_seed = {s: {"eval/geneval/overall": level + 0.01 * int(s)} for s in seeds}
        (out / "per_seed.json").write_text(json.dumps(per_seed))
        (out / "per_seed_best.json").write_text(json.dumps({} if target == "base" else per_seed))
        (out / "per_prompt.json").write_text(json.dumps(_pp(level, seeds=tuple(seeds))))
        if target == "base":
            continue
        for s in seeds:
            d = reports / "train" / target / "seeds" / f"seed{s}"
            d.mkdir(parents=True)
            rows = [{"step": i + 1, "reward/mean": 0.4 + 0.02 * i + (0.01 if i % 2 else -0.01), "time/step": 6.0}
                    for i in range(20)]
            (d / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_acceptance_table_reports_the_methods_it_can(tmp_path):
    # grpo was rerun on other seeds (no record for the current seeds 0, 1, 2); mar_grpo has them
    _write_study(tmp_path, {"grpo": ["5", "6", "7"], "mar_grpo": ["0", "1", "2"]})
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "acceptance_table.py"), "--reports", str(tmp_path),
                          "--params", str(ROOT / "params.yaml"), "--methods", "grpo,mar_grpo"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in out.stdout.splitlines()
             if line.startswith("| ")}
    assert "no record for seeds 0, 1, 2" in lines[("grpo", "-")]
    final = lines[("mar_grpo", "final")]
    assert "+0.100 [+0.100, +0.100]" in final and final.rstrip().endswith("| yes |")
    assert "not reported (no record for seeds 0, 1, 2): grpo" in out.stdout


def test_summary_compares_the_reward_detector_gain_with_the_judge_gain():
    base, grpo = _pp(0.4), _pp(0.5)
    for s in grpo["final"].values():   # the reward's detector sees twice the judge's gain
        s["proxy_geneval"] = [v + 0.1 for v in s["proxy_geneval"]]
    line = summary_text.reward_vs_judge({"base": base, "grpo": grpo}, ["grpo"])
    assert "grpo +0.200 by the reward's detector, +0.100 by the judge" in line
    assert summary_text.reward_vs_judge({"grpo": grpo}, ["grpo"]) is None


def test_noise_line_states_sigma_e_beside_the_seed_spread():
    from margrpo.report.build import noise_line

    evals = {"base": {"std": {"eval/geneval/overall": 0.008}, "replicates": 3},
             "grpo": {"std": {"eval/geneval/overall": 0.031}}}
    line = noise_line(evals, ["grpo"])
    assert "sigma_E = 0.008" in line and "3 evaluation seeds" in line and "grpo 0.031" in line
    assert noise_line({"base": {"std": {}, "replicates": 1}}, ["grpo"]) is None

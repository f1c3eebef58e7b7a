"""The README's results table, written from the committed study under reports/ so that it
cannot drift from it: scripts/readme_results.py rewrites the block between the markers,
and a test fails when the README's block differs from what reports/ gives.

One row per target: GenEval-rule overall on the test split by the evaluation judge with its
95% t-interval over seeds, the gain over the base (paired by seed and prompt) and
the per-seed gains, the T2I-CompBench-style mean, the overall on the novel-binding prompts,
the same overall by the training reward's own detector (the proxy: where it runs ahead of the
judge, the reward is being gamed), and the training minutes per seed.
"""
from __future__ import annotations

import json
from pathlib import Path

from margrpo.report.claims import FAILS, HOLDS, NO_DIFF, STATUS_CODE, UNSURE
from margrpo.report.intervals import NOVEL_SUBSETS, read_per_prompt, score_interval

START, END = "<!-- results:start -->", "<!-- results:end -->"
OVERALL, T2I, PROXY = "eval/geneval/overall", "eval/t2i/mean", "eval/proxy/geneval/overall"


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _minutes(reports: Path, method: str) -> str:
    """Training minutes per seed (sum of time/step over the run), as "a-b" over seeds."""
    mins = []
    for hist in sorted((reports / "train" / method / "seeds").glob("seed*/history.jsonl")):
        rows = [json.loads(line) for line in hist.read_text().splitlines() if line.strip()]
        mins.append(sum(r.get("time/step", 0.0) for r in rows) / 60)
    if not mins:
        return "–"
    lo, hi = min(mins), max(mins)
    return f"{lo:.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:.1f}-{hi:.1f}"


def results_table(reports: Path, targets: list[str]) -> str:
    """Markdown table of the study in `reports` for `targets` (base first)."""
    base_pp = read_per_prompt(reports, "base")
    base_seed = _json(reports / "eval" / "base" / "per_seed.json")
    lines = ["| model | test overall (judge) | gain vs base | per-seed gains | T2I mean | novel bindings "
             "| reward's detector | train min / seed |",
             "|---|---|---|---|---|---|---|---|"]
    for t in targets:
        pp = read_per_prompt(reports, t)
        if pp is None:
            continue
        iv = score_interval(pp, OVERALL)
        t2i = score_interval(pp, T2I)
        novel = score_interval(pp, OVERALL, subsets=NOVEL_SUBSETS)
        proxy = _json(reports / "eval" / t / "metrics.json").get("mean", {}).get(PROXY)
        if t == "base":
            gain = gains = minutes = "–"
        else:
            g = score_interval(pp, OVERALL, minus=base_pp)
            gain = g.cell(signed=True)
            per_seed = _json(reports / "eval" / t / "per_seed.json")
            gains = ", ".join(f"{v[OVERALL] - base_seed[s][OVERALL]:+.3f}" for s, v in per_seed.items()
                              if s in base_seed and OVERALL in v)
            minutes = _minutes(reports, t)
        lines.append(f"| {t} | {iv.cell()} | {gain} | {gains} | {t2i.point:.3f} | "
                     f"{'–' if novel is None else f'{novel.point:.3f}'} | "
                     f"{'–' if proxy is None else f'{proxy:.3f}'} | {minutes} |")
    return "\n".join(lines)


def claims_line(reports: Path) -> str:
    """The claims' verdicts as reports/summary.json codes them (the report's claims table,
    claims.STATUS_CODE), grouped by verdict from holds to does not hold; '' without them.
    A key or code it does not know is left out (the claims table has every claim)."""
    status = {code: name for name, code in STATUS_CODE.items()}
    by_status: dict[str, list[int]] = {}
    for key, code in _json(reports / "summary.json").get("claims", {}).items():
        if key.removeprefix("claim").isdigit() and code in status:
            by_status.setdefault(status[code], []).append(int(key.removeprefix("claim")))
    if not by_status:
        return ""
    order = (HOLDS, NO_DIFF, UNSURE, FAILS)
    return ("Claims of the paper (method.md §6) in the report's claims table: "
            + "; ".join(f"{name}: {', '.join(map(str, sorted(by_status[name])))}" for name in order
                        if name in by_status) + ".")


def replace_block(text: str, table: str) -> str:
    """text with the block between START and END replaced by table."""
    if START not in text or END not in text:
        raise ValueError(f"the README has no {START} ... {END} block to write the results into")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"

"""Stage report: reports/report.md, reports/report.html (self-contained) and
reports/summary.json (claim verdicts and headline scores, DVC metrics), with the claims'
margins, effects and power from study_design.yaml. The study's MLflow
parent run gets the report and the headline numbers, so the runs table shows them.
"""
from __future__ import annotations

import time
from pathlib import Path

from pipeline import common, proc

TITLE = "MAR-GRPO study report"


def provenance(study) -> str:
    """The line under the title: what produced this report, and from which inputs."""
    from margrpo.tracking.runs import git_revision, params_hash

    rev = git_revision(common.tracking_root())
    return (f"git {rev[:10]} · {time.strftime('%Y-%m-%d %H:%M %Z')} · experiment {common.exp_name()} · "
            f"params {params_hash(common.PARAMS_FILE.read_text())} · MLflow study {study.study}")


@proc.task()
def write_report(params, subtitle: str) -> dict:
    from margrpo.report import design
    from margrpo.report.build import build
    from margrpo.report.render import to_html, to_markdown

    methods = list(params.methods)
    staged = common.staging_dir(common.REPORTS / "figures")
    sections, summary = build(params, [*common.EVAL_TARGETS, *methods], methods, common.REPORTS, staged,
                              design.read(Path(design.DESIGN_FILE)))
    common.replace_dir(staged, common.REPORTS / "figures")
    for s in sections:  # the figures now live in reports/figures
        for f in s.figures:
            if f.path.parent == staged:
                f.path = common.REPORTS / "figures" / f.path.name
    common.write_text(to_markdown(TITLE, sections, common.REPORTS, subtitle), common.REPORTS / "report.md")
    common.write_text(to_html(TITLE, sections, subtitle), common.REPORTS / "report.html")
    common.write_json(summary, common.REPORTS / "summary.json")
    return summary


@proc.flow("report")
def report() -> None:
    from margrpo.tracking.runs import headline_metrics

    params = common.load()
    study = proc.open_study(params)
    run_id = study.child("report")
    summary = write_report(params, provenance(study))
    for name in ("report.md", "report.html", "summary.json"):
        study.log_artifact(run_id, common.REPORTS / name, "report")
        study.log_artifact(study.parent_id, common.REPORTS / name, "report")
    study.log_artifact(run_id, common.REPORTS / "figures", "report/figures")
    study.log_metrics(study.parent_id, headline_metrics(summary), digits=4)
    study.log_metrics(run_id, headline_metrics(summary), digits=4)
    study.finish(run_id)
    print("report: reports/report.md, reports/report.html; claims", summary["claims"])


if __name__ == "__main__":
    proc.main("report", report)

"""Stage report: reports/report.md, reports/report.html (self-contained) and
reports/summary.json (claim verdicts and headline scores, DVC metrics); closes the
study's MLflow parent run with the report attached.
"""
from pipeline.common import preamble

preamble()

from prefect import flow, task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from pipeline import common  # noqa: E402

TITLE = "MAR-GRPO study report"


@task(cache_policy=NO_CACHE)
def write_report(params) -> dict:
    from margrpo.report.build import build
    from margrpo.report.render import to_html, to_markdown

    methods = list(params.methods)
    sections, summary = build(params, [*common.EVAL_TARGETS, *methods], methods, common.REPORTS)
    (common.REPORTS / "report.md").write_text(to_markdown(TITLE, sections, common.REPORTS))
    (common.REPORTS / "report.html").write_text(to_html(TITLE, sections))
    common.write_json(summary, common.REPORTS / "summary.json")
    return summary


@flow(name="report")
def report() -> None:
    params = common.load()
    study = common.open_study(params)
    run_id = study.child("report")
    summary = write_report(params)
    for name in ("report.md", "report.html", "summary.json"):
        study.log_artifact(run_id, common.REPORTS / name, "report")
        study.log_artifact(study.parent_id, common.REPORTS / name, "report")
    study.log_artifact(run_id, common.REPORTS / "figures", "report/figures")
    study.log_metrics(study.parent_id, {f"claims/{k}": v for k, v in summary["claims"].items()})
    study.finish(run_id)
    study.finish(study.parent_id)
    print("report: reports/report.md, reports/report.html; claims", summary["claims"])


if __name__ == "__main__":
    report()

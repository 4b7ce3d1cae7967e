"""Renderings of a Report: report.json (+ tensors as .npz), junit.xml, summary.md and report.html.

Every format is drawn from the same result objects; nothing is measured here. The conventions a
check follows so its data is plotted are in ``plots.py`` (and README.md beside this file).
"""

from __future__ import annotations

from pathlib import Path

from cuvil.verify.report import Report


def write_reports(report: Report, folder: str | Path) -> dict[str, Path]:
    """Write every format into ``folder``; returns {format: path}."""
    from cuvil.verify.render.html import write_html
    from cuvil.verify.render.json import write_json
    from cuvil.verify.render.junit import write_junit
    from cuvil.verify.render.markdown import write_markdown

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return {
        "json": write_json(report, out / "report.json"),
        "junit": write_junit(report, out / "junit.xml"),
        "markdown": write_markdown(report, out / "summary.md"),
        "html": write_html(report, out / "report.html"),
    }

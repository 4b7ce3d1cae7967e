"""summary.md: the verdict and a table of results, for CI job summaries and pull-request comments.

GitHub renders it as is (``cat summary.md >> $GITHUB_STEP_SUMMARY``). Failures and warnings
come first with where they point and their figures; passes are one table row each.
"""

from __future__ import annotations

from pathlib import Path

from cuvil.verify.base import CheckResult, Status
from cuvil.verify.report import STATUS_ORDER, Report, is_error

ICONS = {Status.PASS: "✅ pass", Status.FAIL: "❌ fail", Status.WARN: "⚠️ warn", Status.SKIP: "⏭️ skip"}


def cell(value: object) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(str(value).split()).replace("|", "\\|") or " "


def _num(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _status(r: CheckResult) -> str:
    return "💥 error" if is_error(r) else ICONS[r.status]


def render_markdown(report: Report) -> str:
    c = report.counts()
    icon = "✅" if report.ok else "❌"
    lines = [f"## {icon} cuvil verify: `{report.model}`", ""]
    lines.append(f"**{report.verdict}**" + (" (strict: warnings fail)" if report.strict else "")
                 + f" — targets: {', '.join(report.targets)}; subject: {report.subject}; {report.seconds:.1f} s")
    lines += ["", "| status | count |", "| --- | ---: |"]
    lines += [f"| {ICONS[s]} | {c[str(s)]} |" for s in STATUS_ORDER]
    attention = [r for r in report.results if r.status in (Status.FAIL, Status.WARN)]
    if attention:
        lines += ["", "### Needs attention", ""]
        for r in sorted(attention, key=lambda r: STATUS_ORDER.index(r.status)):
            target = f" on `{r.target}`" if r.target else ""
            lines.append(f"- {_status(r)} **{r.check}**{target}: {cell(r.summary)}")
            if r.where:
                lines.append("  - where: " + ", ".join(f"{k} `{cell(v)}`" for k, v in r.where.items()))
            if r.figures:
                lines.append("  - " + ", ".join(f"{k} = {_num(v)}" for k, v in list(r.figures.items())[:8]))
    lines += ["", "### Results", "", "| check | target | status | summary | where | time |",
              "| --- | --- | --- | --- | --- | ---: |"]
    for r in report.results:
        where = ", ".join(f"{k}: {v}" for k, v in r.where.items())
        lines.append(f"| {cell(r.check)} | {cell(r.target or '—')} | {_status(r)} | {cell(r.summary)} | "
                     f"{cell(where or '—')} | {r.seconds:.2f} s |")
    if report.inputs:
        lines += ["", "### Inputs", "", "| input | values | from |", "| --- | --- | --- |"]
        lines += [f"| {cell(i['name'])} | {cell(i['domain'])} | {cell(i['source'])} |" for i in report.inputs]
    if report.dims:
        lines += ["", "### Dims", "", "| dim | smallest valid | samples use | why |", "| --- | ---: | ---: | --- |"]
        lines += [f"| {cell(d['symbol'])} | {d['smallest']} | {d['sample']} | {cell(d['why'])} |" for d in report.dims]
    lines += [f"\n> ⚠️ {w}" for w in report.warnings]
    lines.append("")
    return "\n".join(lines)


def write_markdown(report: Report, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_markdown(report), encoding="utf-8")
    return p

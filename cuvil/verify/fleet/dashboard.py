"""index.html: the fleet dashboard, one self-contained page (inline CSS, no script, no external file).

A grid of models (rows) by (target, check group) (columns), each cell coloured by its job's
status and linking to the job's full ``cuvil verify`` report (its log where the process died
before writing one), with the time and the trend against the baseline run; the rows are the
slowest models first.  Below it: the most drifted jobs, the slowest jobs, and what changed since
the baseline run.
"""

from __future__ import annotations

from html import escape

from cuvil.verify.fleet.jobs import JobResult
from cuvil.verify.fleet.report import Cell, FleetReport, cell_of, trend

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 1200px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin: 18px 0 6px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; }
th { background: #f6f6f6; } .num { text-align: right; font-variant-numeric: tabular-nums; }
td.cell { min-width: 90px; text-align: center; } td.cell a { color: inherit; font-weight: bold; }
td.cell small { display: block; font-weight: normal; }
.status-pass { background: #c8e6c9; } .status-fail { background: #ffcdd2; } .status-error { background: #e1bee7; }
.status-crash { background: #b71c1c; color: #fff; } .status-timeout { background: #ffe0b2; }
.status-memory { background: #d1c4e9; } .status-notrun { background: #eeeeee; } .none { color: #999; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff; font-weight: bold; }
.badge.ok { background: #2e7d32; } .badge.bad { background: #c62828; }
"""


def _trend_mark(r: JobResult, report: FleetReport) -> str:
    t = trend(r, report.previous.get(cell_of(r)))
    if t is None:
        return ""
    if t["changed"]:
        return f" (was {escape(str(t['status']))})"
    delta = t.get("seconds_delta")
    if isinstance(delta, float) and abs(delta) >= 0.05:
        return f" ({'+' if delta > 0 else ''}{delta:.1f} s)"
    return ""


def _cell(report: FleetReport, model: str, column: tuple[str, str], planned: set[Cell]) -> str:
    target, checks = column
    if (model, target, checks) not in planned:
        return '<td class="cell none">—</td>'
    r = report.result(model, target, checks)
    if r is None:
        return '<td class="cell status-notrun">not run</td>'
    sig = f"<small>{escape(r.signature)}</small>" if r.signature else ""
    resumed = " (resumed)" if r.resumed else ""
    return (f'<td class="cell status-{r.status}" data-key="{r.key}" title="{escape(r.summary)}">'
            f'<a href="{escape(report.link(r))}">{r.status}</a>{sig}'
            f"<small>{r.seconds:.1f} s{escape(_trend_mark(r, report))}{resumed}</small></td>")


def _job_row(report: FleetReport, r: JobResult, value: str) -> str:
    return (f'<tr><td>{escape(r.model)}</td><td>{escape(r.target)}</td><td>{escape(r.checks)}</td>'
            f'<td class="status-{r.status}"><a href="{escape(report.link(r))}">{r.status}</a></td>'
            f'<td class="num">{value}</td><td>{escape(r.summary[:200])}</td></tr>')


def render_dashboard(report: FleetReport) -> str:
    columns = list(dict.fromkeys((j.target, j.checks) for j in report.jobs))
    planned = {cell_of(j) for j in report.jobs}
    seconds = {m: sum(r.seconds for r in report.results if r.model == m) for m in report.models()}
    models = sorted(report.models(), key=lambda m: -seconds[m])  # the slowest first
    head = "".join(f"<th>{escape(t)}<br><small>{escape(c)}</small></th>" for t, c in columns)
    rows = [f'<tr><th>{escape(m)}<br><small>{seconds[m]:.1f} s</small></th>'
            + "".join(_cell(report, m, col, planned) for col in columns) + "</tr>" for m in models]
    drifted = sorted((r for r in report.results if r.drift is not None), key=lambda r: -(r.drift or 0.0))
    slowest = sorted(report.results, key=lambda r: -r.seconds)
    changes = [(r, t) for r in report.results
               if (t := trend(r, report.previous.get(cell_of(r)))) is not None and t["changed"]]
    counts = ", ".join(f"{n} {s}" for s, n in report.counts().items() if n)
    badge = f'<span class="badge {"ok" if report.ok else "bad"}">{escape(report.verdict)}</span>'
    job_head = "<tr><th>model</th><th>target</th><th>checks</th><th>status</th><th>{}</th><th>summary</th></tr>"
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>cuvil verify-fleet: {escape(report.fleet)}</title><style>{CSS}</style></head><body>",
        f"<h1>cuvil verify-fleet {badge}</h1>",
        f"<p>{escape(report.fleet)}: {len(models)} models, {len(report.jobs)} jobs ({escape(counts)}); "
        f"{escape(report.executor)} executor; started {escape(report.started)}, {report.seconds:.1f} s. "
        f"{'Trends against the baseline run.' if report.previous else 'No baseline run to compare with.'}</p>",
        '<h2>Models by target and check group</h2><table class="grid">'
        f"<tr><th>model (slowest first)</th>{head}</tr>", *rows, "</table>",
        "<h2>Most drifted</h2><table>", job_head.format("drift"),
        *[_job_row(report, r, f"{r.drift:.3g}") for r in drifted[:20]], "</table>",
        "<h2>Slowest</h2><table>", job_head.format("seconds"),
        *[_job_row(report, r, f"{r.seconds:.1f}") for r in slowest[:20]], "</table>",
    ]
    if report.previous:
        parts += ["<h2>Changed since the baseline run</h2>"]
        if changes:
            parts += ["<table>", job_head.format("was"),
                      *[_job_row(report, r, escape(str(t["status"]))) for r, t in changes], "</table>"]
        else:
            parts.append("<p>No job changed status.</p>")
    parts += ["</body></html>", ""]
    return "\n".join(parts)

"""report.html: one self-contained page (inline CSS and SVG, no script, no external file).

The header gives the verdict and counts, a table links every result, and each result has a
section: summary, where it points, figures, the plots and tables its details ask for (see
``plots.py``), the rest of its details as JSON, and a crashed check's traceback.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from cuvil.verify.base import CheckResult
from cuvil.verify.render.plots import PLOT_KEYS, plots_of
from cuvil.verify.render.svg import chart
from cuvil.verify.report import STATUS_ORDER, Report, is_error, to_jsonable

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin: 0 0 6px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
th { background: #f6f6f6; } .num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff; font-weight: bold; }
.pass { background: #2e7d32; } .fail { background: #c62828; } .warn { background: #ef6c00; } .skip { background: #757575; }
.error { background: #6a1b9a; }
section.result { border: 1px solid #ddd; border-left: 6px solid #999; padding: 10px 14px; margin: 14px 0; }
section.status-pass { border-left-color: #2e7d32; } section.status-fail { border-left-color: #c62828; }
section.status-warn { border-left-color: #ef6c00; } section.status-skip { border-left-color: #757575; }
figure { margin: 8px 0; } pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
.note { color: #a00; }
"""


def _badge(r: CheckResult) -> str:
    if is_error(r):
        return '<span class="badge error">error</span>'
    return f'<span class="badge {r.status}">{r.status}</span>'


def _kv_table(items: dict[str, Any], cls: str = "") -> str:
    rows = "".join(f'<tr><th>{escape(str(k))}</th><td class="{cls}">{escape(_value(v))}</td></tr>' for k, v in items.items())
    return f"<table>{rows}</table>"


def _value(v: Any) -> str:
    v = to_jsonable(v)
    if isinstance(v, float):
        return f"{v:.6g}"
    return v if isinstance(v, str) else json.dumps(v)


def _table(p: dict[str, Any]) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in p["columns"])
    body = "".join("<tr>" + "".join(f"<td>{escape(_value(v))}</td>" for v in row) + "</tr>" for row in p["rows"])
    title = f"<figcaption>{escape(p['title'])}</figcaption>" if p["title"] else ""
    return f'<figure class="table">{title}<table><tr>{head}</tr>{body}</table></figure>'


def _section(i: int, r: CheckResult, tensors_note: bool) -> str:
    target = f" [{escape(r.target)}]" if r.target else ""
    parts = [f'<section class="result status-{r.status}" id="r{i}">',
             f"<h2>{escape(r.check)}{target} {_badge(r)}</h2>", f"<p>{escape(r.summary)}</p>"]
    if r.where:
        parts.append("<h3>where</h3>" + _kv_table(dict(r.where)))
    if r.figures:
        parts.append("<h3>figures</h3>" + _kv_table(dict(r.figures), "num"))
    plots, notes = plots_of(r.details)
    for p in plots:
        parts.append(_table(p) if p["kind"] == "table" else f"<figure>{chart(p)}</figure>")
    parts += [f'<p class="note">{escape(n)}</p>' for n in notes]
    if is_error(r):
        parts.append(f"<h3>traceback</h3><pre>{escape(str(r.details['error'].get('traceback', '')))}</pre>")
    rest = {k: v for k, v in r.details.items() if k not in PLOT_KEYS and k != "error"}
    if rest:
        text = json.dumps(to_jsonable(rest), indent=1)
        parts.append(f"<details><summary>details</summary><pre>{escape(text)}</pre></details>")
    if r.tensors and tensors_note:
        parts.append(f"<p>tensors (in the .npz beside report.json): {escape(', '.join(sorted(r.tensors)))}</p>")
    parts.append("</section>")
    return "\n".join(parts)


def render_html(report: Report) -> str:
    c = report.counts()
    verdict_cls = "pass" if report.ok else "fail"
    env = {"model": report.model, "subject": report.subject, "targets": ", ".join(report.targets),
           "checks": ", ".join(report.checks), "strict": report.strict, "started": report.started,
           "seconds": f"{report.seconds:.1f}", **report.environment}
    if report.config_path:
        env["config"] = report.config_path
    for inp in report.inputs:  # what each input's samples were drawn from
        env[f"input {inp['name']}"] = f"{inp['domain']} ({inp['source']})"
    for d in report.dims:  # the extents each symbolic dim's samples use
        env[f"dim {d['symbol']}"] = d["why"]
    for n, w in enumerate(report.warnings, 1):
        env[f"warning {n}"] = w
    counts = " ".join(f'<span class="badge {s}">{c[str(s)]} {s}</span>' for s in STATUS_ORDER)
    rows = []
    for i, r in enumerate(report.results):
        rows.append(f'<tr><td><a href="#r{i}">{escape(r.check)}</a></td><td>{escape(r.target or "—")}</td>'
                    f'<td>{_badge(r)}</td><td>{escape(r.summary)}</td>'
                    f'<td>{escape(", ".join(f"{k}: {v}" for k, v in r.where.items()))}</td>'
                    f'<td class="num">{r.seconds:.2f} s</td></tr>')
    order = sorted(range(len(report.results)), key=lambda i: STATUS_ORDER.index(report.results[i].status))
    sections = [_section(i, report.results[i], True) for i in order]
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>cuvil verify: {escape(report.model)}</title><style>{CSS}</style></head><body>",
        f'<h1>cuvil verify: {escape(report.model)} <span class="badge {verdict_cls}">{escape(report.verdict)}</span></h1>',
        f"<p>{counts}</p>", _kv_table(env),
        "<h2>Results</h2><table><tr><th>check</th><th>target</th><th>status</th><th>summary</th><th>where</th>"
        "<th>time</th></tr>", *rows, "</table>",
        *sections, "</body></html>", ""])


def write_html(report: Report, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_html(report), encoding="utf-8")
    return p

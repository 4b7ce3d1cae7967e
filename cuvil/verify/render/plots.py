"""What a check puts in ``CheckResult.details`` to get plots and tables in the reports.

Checks are written independently of the renderers; these conventions are the contract.
Every plot is a dict with a ``kind``; a result lists them in ``details["plots"]``, or uses
one of the shorthand keys (``details["series"]``, ``details["bars"]``, ``details["matrix"]``,
``details["table"]``) for a single one:

``line``  (shorthand ``series``: the dict below, or just its ``series`` list)
    ``{"kind": "line", "title": str, "x_label": str, "y_label": str, "log_y": bool,
    "series": [{"name": str, "x": [number], "y": [number | None]}],
    "x_ticks": [str], "threshold": number}``; ``x`` defaults to 0, 1, 2...; ``x_ticks`` names
    those positions (layer names); ``threshold`` draws a dashed line. Per-layer error curves,
    batch-scaling curves.
``bars``  (shorthand ``bars``: the dict, or its list of bars)
    ``{"kind": "bars", "title": str, "unit": str, "bars": [{"label": str, "value": number}]}``;
    horizontal bars in the order given. Latency breakdowns.
``matrix``  (shorthand ``matrix``)
    ``{"kind": "matrix", "title": str, "rows": [str], "cols": [str],
    "values": [[number | None]], "log": bool, "unit": str}``; a heat map, ``None`` cells blank.
    Drift matrices.
``table``  (shorthand ``table``)
    ``{"kind": "table", "title": str, "columns": [str], "rows": [[value]]}``.

Record forms, so a check can keep one list of rows for both its data and its plots:

- ``details["series"]`` as a list of row dicts (``[{"layer": 0, "rel_l2": 1e-7, ...}]``):
  x is the ``x`` column, else the first column that is an integer in every row; every other
  column that is a number (or None) in every row gets its own line chart, log-scaled when its
  positive values span more than two decades; a ``threshold`` column is drawn as a dashed
  series on the first chart; ``x_ticks`` come from a ``value``, ``name`` or ``label`` column.
- ``details["breakdown"]`` (or ``bars``) as row dicts: a bar per row, labelled by its first
  text column and sized by its first numeric column (``{"name": "conv1", "median_ms": 0.2}``).
- ``details["matrix"]`` as a bare list of rows: a heat map whose rows and columns are named by
  ``details["labels"]`` (or ``details["rows"]`` / ``details["cols"]``).

Numbers may be NaN or infinite (drawn as gaps or noted). A malformed entry never breaks a
report: it is left out and named in the rendering's notes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

SHORTHANDS = {"series": "line", "bars": "bars", "breakdown": "bars", "matrix": "matrix", "table": "table"}
_LIST_KEY = {"line": "series", "bars": "bars"}


def number(v: Any) -> float | None:
    """A finite float, or None (missing, NaN, infinite or not a number)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _line(spec: Mapping[str, Any]) -> dict[str, Any]:
    series = []
    for i, s in enumerate(spec["series"]):
        y = list(s["y"])
        x = list(s.get("x", range(len(y))))
        if len(x) != len(y):
            raise ValueError(f"series {i}: {len(x)} x values, {len(y)} y values")
        series.append({"name": str(s.get("name", f"series {i}")), "x": [number(v) for v in x],
                       "y": [number(v) for v in y]})
    if not series:
        raise ValueError("no series")
    return {"kind": "line", "title": str(spec.get("title", "")), "x_label": str(spec.get("x_label", "")),
            "y_label": str(spec.get("y_label", "")), "log_y": bool(spec.get("log_y", False)), "series": series,
            "x_ticks": [str(t) for t in spec.get("x_ticks", [])], "threshold": number(spec.get("threshold"))}


def _bars(spec: Mapping[str, Any]) -> dict[str, Any]:
    bars = [{"label": str(b["label"]), "value": number(b["value"])} for b in spec["bars"]]
    if not bars:
        raise ValueError("no bars")
    return {"kind": "bars", "title": str(spec.get("title", "")), "unit": str(spec.get("unit", "")), "bars": bars}


def _matrix(spec: Mapping[str, Any]) -> dict[str, Any]:
    rows, cols = [str(r) for r in spec["rows"]], [str(c) for c in spec["cols"]]
    values = [[number(v) for v in row] for row in spec["values"]]
    if len(values) != len(rows) or any(len(row) != len(cols) for row in values):
        raise ValueError(f"values are not {len(rows)} x {len(cols)}")
    return {"kind": "matrix", "title": str(spec.get("title", "")), "rows": rows, "cols": cols, "values": values,
            "log": bool(spec.get("log", False)), "unit": str(spec.get("unit", ""))}


def _table(spec: Mapping[str, Any]) -> dict[str, Any]:
    columns = [str(c) for c in spec["columns"]]
    rows = [list(r) for r in spec["rows"]]
    if any(len(r) != len(columns) for r in rows):
        raise ValueError(f"rows must have {len(columns)} cells")
    return {"kind": "table", "title": str(spec.get("title", "")), "columns": columns, "rows": rows}


_NORMALIZE = {"line": _line, "bars": _bars, "matrix": _matrix, "table": _table}


def _is_records(spec: Any) -> bool:
    return (isinstance(spec, Sequence) and not isinstance(spec, str) and bool(spec)
            and all(isinstance(r, Mapping) for r in spec))


def _is_num(v: Any) -> bool:
    return v is None or (not isinstance(v, bool) and isinstance(v, (int, float)))


def _line_records(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    ints = [k for k in keys if all(isinstance(r[k], int) and not isinstance(r[k], bool) for r in rows)]
    x_key = "x" if "x" in keys else (ints[0] if ints else None)
    x = [r[x_key] for r in rows] if x_key else list(range(len(rows)))
    label = next((k for k in ("value", "name", "label") if k in keys and all(isinstance(r[k], str) for r in rows)), None)
    ticks = [r[label] for r in rows] if label and x_key in (None, "layer", "index") else []
    ys = [k for k in keys if k not in (x_key, "threshold") and all(_is_num(r[k]) for r in rows)
          and any(r[k] is not None for r in rows)]
    if not ys:
        raise ValueError("the rows have no numeric column to plot")
    out = []
    for i, k in enumerate(ys):
        series = [{"name": k, "x": x, "y": [r[k] for r in rows]}]
        if i == 0 and "threshold" in keys and all(_is_num(r["threshold"]) for r in rows):
            series.append({"name": "threshold", "x": x, "y": [r["threshold"] for r in rows]})
        pos = [float(v) for s in series for v in s["y"] if number(v) is not None and float(v) > 0]
        log = bool(pos) and all(number(v) is None or float(v) > 0 for s in series for v in s["y"]) \
            and max(pos) > 100 * min(pos)
        out.append(_line({"title": f"{k} by {x_key or 'row'}", "x_label": x_key or "row", "y_label": k,
                          "log_y": log, "series": series, "x_ticks": ticks}))
    return out


def _bar_records(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    label = next((k for k, v in first.items() if isinstance(v, str)), None)
    value = next((k for k, v in first.items() if _is_num(v) and v is not None), None)
    if label is None or value is None:
        raise ValueError("bar rows need a text column and a numeric column")
    return _bars({"title": value, "unit": "", "bars": [{"label": r[label], "value": r.get(value)} for r in rows]})


def expand(spec: Any, kind: str | None, details: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry of ``details`` as normalized plots (record forms may give several)."""
    if kind == "line" and _is_records(spec) and not all("y" in r for r in spec):
        return _line_records(spec)
    if kind == "bars" and _is_records(spec) and not all("label" in r and "value" in r for r in spec):
        return [_bar_records(spec)]
    if kind == "matrix" and isinstance(spec, Sequence) and not isinstance(spec, str):
        n = len(spec)
        labels = details.get("labels")
        rows = details.get("rows", labels if labels is not None else [str(i) for i in range(n)])
        cols = details.get("cols", labels if labels is not None else [str(j) for j in range(len(spec[0]) if n else 0)])
        return [_matrix({"title": str(details.get("metric", "")), "rows": rows, "cols": cols, "values": spec,
                         "log": True})]
    return [normalize(spec, kind)]


def normalize(spec: Any, kind: str | None = None) -> dict[str, Any]:
    """One plot spec in its full form; raises ValueError (or KeyError/TypeError) when malformed."""
    if kind in _LIST_KEY and isinstance(spec, Sequence) and not isinstance(spec, str):
        spec = {_LIST_KEY[kind]: spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"a plot is a table (dict), not {type(spec).__name__}")
    k = str(spec.get("kind", kind or ""))
    if k not in _NORMALIZE:
        raise ValueError(f"unknown plot kind {k!r} (known: {', '.join(_NORMALIZE)})")
    return _NORMALIZE[k](spec)


def plots_of(details: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The plots a result's details ask for, normalized, and notes on the malformed ones."""
    wanted: list[tuple[str, Any, str | None]] = []
    raw = details.get("plots")
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        wanted += [(f"plots[{i}]", p, None) for i, p in enumerate(raw)]
    elif raw is not None:
        wanted.append(("plots", raw, None))
    wanted += [(key, details[key], kind) for key, kind in SHORTHANDS.items() if key in details]
    plots, notes = [], []
    for where, spec, kind in wanted:
        try:
            plots.extend(expand(spec, kind, details))
        except (ValueError, KeyError, TypeError) as exc:
            notes.append(f"details[{where!r}] left out: {type(exc).__name__}: {exc}")
    return plots, notes


PLOT_KEYS = frozenset({"plots", *SHORTHANDS})

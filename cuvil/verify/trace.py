"""Chrome trace export of measured timelines (``--trace FILE``; opens in Perfetto and chrome://tracing).

A check that measures time puts one run's timeline in ``details["timeline"]``:
a list of ``{"name", "cat", "start_us", "dur_us"}`` spans, relative to the
start of that run.  This module renders the timelines of a set of results as
the Trace Event Format's JSON object form: one process per target (named by
metadata events), complete ("X") events in microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cuvil.verify.base import CheckResult


def chrome_trace(results: Iterable[CheckResult]) -> dict[str, Any]:
    """The Trace Event Format object of every result that carries a timeline."""
    events: list[dict[str, Any]] = []
    pid = 0
    for r in results:
        timeline = r.details.get("timeline")
        if not timeline:
            continue
        pid += 1
        label = f"{r.check} [{r.target or 'all'}]"
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "calling thread"}})
        for span in timeline:
            start, dur = float(span["start_us"]), float(span["dur_us"])
            if dur < 0 or start < 0:
                raise ValueError(f"{label}: span {span['name']!r} has a negative start or duration")
            events.append({"ph": "X", "name": str(span["name"]), "cat": str(span.get("cat", "")), "pid": pid,
                           "tid": 1, "ts": start, "dur": dur, "args": dict(span.get("args", {}))})
    return {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"producer": "cuvil verify"}}


def write_chrome_trace(path: str | Path, results: Iterable[CheckResult]) -> Path:
    """Write :func:`chrome_trace` of ``results`` to ``path`` (JSON) and return the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(chrome_trace(results), indent=None, separators=(",", ":")), encoding="utf-8")
    return out

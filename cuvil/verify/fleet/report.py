"""The fleet report: every job's result, and its renderings in the results folder.

- ``fleet.json``: the sweep and every job (status, signature of an abnormal end, figures, the link
  to its ``cuvil verify`` report, the trend against the baseline run);
- ``junit.xml``: one test suite per model, one test case per (target, check group) job; a job that
  failed a check is a failure, one that crashed, hung, ran out of memory or could not start is
  an error carrying its signature;
- ``summary.md``: the verdict and a table of the jobs that did not pass;
- ``index.html``: the dashboard (cuvil/verify/fleet/dashboard.py).

The baseline run of the trends is a previous ``fleet.json``: the one named, or else the one the
results folder holds from its last sweep.  Exit status: 0 when every job passed, 1 when one did
not (or jobs were left unrun by ``max_failures``); 2, a usage error, is raised before any job runs.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuvil._version import __version__
from cuvil.verify.base import VerifyError
from cuvil.verify.fleet.jobs import ABNORMAL, STATUSES, Job, JobResult, ResultStore
from cuvil.verify.report import to_jsonable

FORMAT = "cuvil-fleet-report"
FORMAT_VERSION = 1

Cell = tuple[str, str, str]  # (model, target, check group)


def cell_of(r: JobResult | Job) -> Cell:
    return (r.model, r.target, r.checks)


def load_previous(path: str | Path | None, out: Path) -> dict[Cell, dict[str, Any]]:
    """Per cell, the baseline run's status, seconds and drift: ``path`` (a fleet.json), else the
    results folder's own fleet.json from its last sweep, else nothing."""
    p = Path(path) if path is not None else out / "fleet.json"
    if path is None and not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise VerifyError(f"{p}: cannot read the baseline run: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise VerifyError(f"{p}: not a fleet report (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("jobs"), list):
        raise VerifyError(f"{p}: not a fleet report (fleet.json of cuvil verify-fleet)")
    return {(str(j["model"]), str(j["target"]), str(j["checks"])): {"status": j.get("status"),
                                                                     "seconds": j.get("seconds"),
                                                                     "drift": j.get("drift"), "key": j.get("key")}
            for j in data["jobs"] if isinstance(j, dict) and {"model", "target", "checks"} <= set(j)}


def trend(result: JobResult, before: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """How a job moved against the baseline run: status then and now, the change in time and drift."""
    if before is None:
        return None
    out: dict[str, Any] = {"status": before.get("status"), "changed": before.get("status") != result.status,
                           "same_inputs": before.get("key") == result.key}
    if isinstance(before.get("seconds"), (int, float)):
        out["seconds_delta"] = result.seconds - float(before["seconds"])
    if isinstance(before.get("drift"), (int, float)) and result.drift is not None:
        out["drift_delta"] = result.drift - float(before["drift"])
    return out


@dataclass
class FleetReport:
    """One sweep: the planned jobs, their results (in plan order), the jobs left unrun."""

    fleet: str
    executor: str
    started: str
    seconds: float
    jobs: list[Job]
    results: list[JobResult]
    not_run: list[Job] = field(default_factory=list)
    why_not_run: str = ""  # "--max-failures 3 reached", "the sweep was cancelled"
    previous: dict[Cell, dict[str, Any]] = field(default_factory=dict)
    store: ResultStore | None = None

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in STATUSES}
        for r in self.results:
            out[r.status] += 1
        out["not run"] = len(self.not_run)
        return out

    @property
    def ok(self) -> bool:
        return not self.not_run and all(r.ok for r in self.results)

    @property
    def exit_status(self) -> int:
        return 0 if self.ok else 1

    @property
    def verdict(self) -> str:
        c = self.counts()
        parts = ", ".join(f"{n} {s}" for s, n in c.items() if n or s in ("pass", "fail"))
        return f"{'PASS' if self.ok else 'FAIL'}: {len(self.results)} of {len(self.jobs)} jobs: {parts}"

    def result(self, model: str, target: str, checks: str) -> JobResult | None:
        return next((r for r in self.results if cell_of(r) == (model, target, checks)), None)

    def models(self) -> list[str]:
        return list(dict.fromkeys(j.model for j in self.jobs))

    def link(self, result: JobResult) -> str:
        """The job's full cuvil verify report, or its log where none was written (a crash, a hang)."""
        folder = Path("jobs") / result.key
        if self.store is not None and (self.store.job_dir(result.key) / "report" / "report.html").is_file():
            return (folder / "report" / "report.html").as_posix()
        return (folder / "log.txt").as_posix()

    def job_json(self, r: JobResult) -> dict[str, Any]:
        return {**r.to_json(), "resumed": r.resumed, "report": self.link(r),
                "trend": trend(r, self.previous.get(cell_of(r)))}

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = to_jsonable({
            "format": FORMAT, "version": FORMAT_VERSION, "cuvil": __version__, "fleet": self.fleet,
            "executor": self.executor, "started": self.started, "seconds": self.seconds, "counts": self.counts(),
            "exit_status": self.exit_status, "verdict": self.verdict,
            "jobs": [self.job_json(r) for r in self.results],
            "not_run": [{"key": j.key, "model": j.model, "target": j.target, "checks": j.checks} for j in self.not_run],
            "why_not_run": self.why_not_run,
        })
        return data

    def write(self, folder: str | Path) -> dict[str, Path]:
        from cuvil.verify.fleet.dashboard import render_dashboard

        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "fleet.json", "junit": out / "junit.xml", "markdown": out / "summary.md",
                 "html": out / "index.html"}
        paths["json"].write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        paths["junit"].write_text(render_junit(self), encoding="utf-8")
        paths["markdown"].write_text(render_markdown(self), encoding="utf-8")
        paths["html"].write_text(render_dashboard(self), encoding="utf-8")
        return paths


def render_junit(report: FleetReport) -> str:
    """JUnit XML: a suite per model, a case per job (failure: a check failed; error: the job did not finish)."""
    suites = ET.Element("testsuites", name="cuvil verify-fleet", tests=str(len(report.jobs)),
                        time=f"{report.seconds:.3f}")
    for model in report.models():
        jobs = [j for j in report.jobs if j.model == model]
        results = [report.result(*cell_of(j)) for j in jobs]
        suite = ET.SubElement(suites, "testsuite", name=model, tests=str(len(jobs)),
                              failures=str(sum(r is not None and r.status == "fail" for r in results)),
                              errors=str(sum(r is not None and r.status in ABNORMAL for r in results)),
                              skipped=str(sum(r is None for r in results)),
                              time=f"{sum(r.seconds for r in results if r is not None):.3f}")
        for j, r in zip(jobs, results):
            case = ET.SubElement(suite, "testcase", name=f"{j.checks}[{j.target}]", classname=model,
                                 time=f"{r.seconds:.3f}" if r is not None else "0")
            if r is None:
                ET.SubElement(case, "skipped", message=f"not run: {report.why_not_run}")
            elif r.status == "fail":
                ET.SubElement(case, "failure", message=r.summary, type="check failed").text = r.summary
            elif r.status in ABNORMAL:
                el = ET.SubElement(case, "error", message=f"{r.status}: {r.signature or ''}: {r.summary}",
                                   type=r.status)
                el.text = r.log_tail
            ET.SubElement(case, "system-out").text = f"report: {report.link(r)}" if r is not None else ""
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _md(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render_markdown(report: FleetReport) -> str:
    c = report.counts()
    lines = [f"# cuvil verify-fleet: {_md(Path(report.fleet).name)}", "", f"**{report.verdict}**", "",
             f"{len(report.models())} models, {len(report.jobs)} jobs, {report.executor} executor, "
             f"{report.seconds:.1f} s", "",
             "| " + " | ".join(c) + " |", "|" + "---|" * len(c), "| " + " | ".join(str(v) for v in c.values()) + " |",
             ""]
    bad = [r for r in report.results if not r.ok]
    if bad:
        lines += ["## Jobs that did not pass", "", "| model | target | checks | status | signature | summary |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {_md(r.model)} | {r.target} | {r.checks} | {r.status} | {_md(r.signature or '')} | "
                  f"{_md(r.summary)[:300]} |" for r in bad]
        lines.append("")
    if report.not_run:
        lines += [f"{len(report.not_run)} jobs not run: {report.why_not_run}.", ""]
    lines += ["Full reports: index.html (the dashboard), fleet.json, junit.xml; each job's cuvil verify report "
              "under jobs/KEY/report/.", ""]
    return "\n".join(lines)

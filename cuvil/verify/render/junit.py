"""junit.xml: one test case per check per target, in the Jenkins / Apache Ant JUnit format.

CI systems (GitHub, GitLab, Jenkins) show these natively. Mapping of results:

- test case ``name`` is ``CHECK[TARGET]`` (``CHECK`` for a target-independent result), its
  ``classname`` ``cuvil.verify.GROUP.CHECK``;
- fail -> ``<failure>``, a crashed check -> ``<error>`` with the traceback, skip -> ``<skipped>``;
- warn passes (a JUnit test has no warning state) unless the run is strict, where it is a
  ``<failure>``; its summary is in ``<system-out>`` either way, prefixed with "WARNING:".

Figures and ``where`` go into ``<system-out>`` so they are one click away in the CI's test view.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from cuvil.verify.base import CheckResult, Status, all_checks
from cuvil.verify.report import Report, is_error, to_jsonable


def case_name(r: CheckResult) -> str:
    return f"{r.check}[{r.target}]" if r.target else r.check


def _classname(r: CheckResult) -> str:
    cls = all_checks().get(r.check)
    group = cls.group if cls is not None else "suite"
    return f"cuvil.verify.{group}.{r.check}"


def _out_text(r: CheckResult) -> str:
    lines = [("WARNING: " if r.status is Status.WARN else "") + f"{r.status}: {r.summary}"]
    if r.where:
        lines.append("where: " + ", ".join(f"{k}={v}" for k, v in r.where.items()))
    for k, v in r.figures.items():
        lines.append(f"{k} = {to_jsonable(v)}")
    return "\n".join(lines) + "\n"


def _testcase(r: CheckResult, strict: bool) -> ET.Element:
    case = ET.Element("testcase", name=case_name(r), classname=_classname(r), time=f"{r.seconds:.3f}")
    if is_error(r):
        err = r.details["error"]
        e = ET.SubElement(case, "error", message=r.summary, type=str(err.get("type", "Error")))
        e.text = str(err.get("traceback") or err.get("message", ""))
    elif r.status is Status.FAIL or (strict and r.status is Status.WARN):
        f = ET.SubElement(case, "failure", message=r.summary, type=f"cuvil.verify.{r.status}")
        body = {"where": r.where, "figures": r.figures}
        f.text = json.dumps(to_jsonable(body), indent=1)
    elif r.status is Status.SKIP:
        ET.SubElement(case, "skipped", message=r.summary)
    out = ET.SubElement(case, "system-out")
    out.text = _out_text(r)
    return case


def junit_tree(report: Report) -> ET.ElementTree[ET.Element]:
    errors = sum(1 for r in report.results if is_error(r))
    failures = sum(1 for r in report.failed if not is_error(r))
    skipped = len(report.by_status(Status.SKIP))
    tests, seconds = len(report.results), f"{report.seconds:.3f}"
    root = ET.Element("testsuites", name="cuvil verify", tests=str(tests), failures=str(failures),
                      errors=str(errors), time=seconds)
    suite = ET.SubElement(root, "testsuite", name=f"cuvil verify {report.model}", tests=str(tests),
                          failures=str(failures), errors=str(errors), skipped=str(skipped), time=seconds,
                          timestamp=report.started.removesuffix("+00:00"),
                          hostname=report.environment.get("hostname", "") or "localhost",
                          id="0", package="cuvil.verify")
    props = ET.SubElement(suite, "properties")
    for name, value in (("model", report.model), ("subject", report.subject), ("targets", ",".join(report.targets)),
                        ("strict", str(report.strict).lower()), *sorted(report.environment.items())):
        ET.SubElement(props, "property", name=name, value=value)
    for r in report.results:
        suite.append(_testcase(r, report.strict))
    ET.SubElement(suite, "system-out").text = report.verdict + "\n"
    ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(report: Report, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    junit_tree(report).write(p, encoding="utf-8", xml_declaration=True)
    return p

"""The fleet dashboard (index.html): a cell per job, coloured by status and linking to the job's report
(or its log), the slowest models first, trends against a baseline run; rendered in headless Chromium
as the single-model report is (tests/verify/test_reports.py)."""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cuvil.verify.fleet.jobs import Job, JobResult, ResultStore
from cuvil.verify.fleet.report import FleetReport, cell_of


class _Cells(HTMLParser):
    """The grid's cells: (class, link, text) per ``td.cell``."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[dict[str, str]] = []
        self._in: dict[str, str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "td" and "cell" in a.get("class", "").split():
            self._in = {"class": a["class"], "href": "", "text": "", "key": a.get("data-key", "")}
            self.cells.append(self._in)
        elif tag == "a" and self._in is not None and not self._in["href"]:
            self._in["href"] = a.get("href", "")

    def handle_data(self, data: str) -> None:
        if self._in is not None:
            self._in["text"] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in = None


def _job(model: str, target: str, checks: str) -> Job:
    key = f"{abs(hash((model, target, checks))):024d}"[:24]
    return Job(model, f"/{model}", target, checks, key, "d", 60.0, None, {})


def sample_fleet(root: Path) -> FleetReport:
    """Two models on two targets and two check groups (one cell not planned, one job not run): every status."""
    store = ResultStore(root)
    jobs = [_job(m, t, c) for m in ("a.onnx", "b.onnx") for t in ("ref", "native") for c in ("compat", "layerwise")
            if (m, t, c) != ("b.onnx", "ref", "layerwise")]
    statuses = {("a.onnx", "ref", "compat"): "pass", ("a.onnx", "ref", "layerwise"): "fail",
                ("a.onnx", "native", "compat"): "crash", ("a.onnx", "native", "layerwise"): "timeout",
                ("b.onnx", "ref", "compat"): "memory", ("b.onnx", "native", "compat"): "pass"}
    results = []
    for i, j in enumerate(jobs):
        status = statuses.get(cell_of(j))
        if status is None:
            continue  # b.onnx native layerwise: not run
        folder = store.job_dir(j.key)
        folder.mkdir(parents=True)
        (folder / "log.txt").write_text("log")
        if status in ("pass", "fail", "memory"):
            (folder / "report").mkdir()
            (folder / "report" / "report.html").write_text("<html>report</html>")
        results.append(JobResult(j.key, j.model, j.target, j.checks, status, f"{status} summary", float(i + 1),
                                 signature={"crash": "SIGSEGV", "timeout": "timeout after 4 s"}.get(status),
                                 drift=1e-7 * (i + 1) if status in ("pass", "fail") else None))
    previous = {("a.onnx", "ref", "compat"): {"status": "fail", "seconds": 3.0, "drift": 1e-6, "key": "x"}}
    return FleetReport("fleet.toml", "local", "2026-01-01T00:00:00Z", 9.0, jobs, results,
                       not_run=[jobs[-1]], why_not_run="--max-failures 2 reached", previous=previous, store=store)


def _check_cells(cells: list[dict[str, str]], report: FleetReport, root: Path) -> None:
    jobs = {j.key: j for j in report.jobs}
    linked = [c for c in cells if c["key"]]
    assert len(cells) == 2 * 4 and len(linked) == len(report.results) == 6  # 2 models x 4 columns
    assert sum("none" in c["class"] for c in cells) == 1 and sum("status-notrun" in c["class"] for c in cells) == 1
    for c in linked:
        r = report.result(*cell_of(jobs[c["key"]]))
        assert r is not None and f"status-{r.status}" in c["class"] and c["text"].startswith(r.status)
        assert (root / c["href"]).is_file(), c  # every link resolves
        assert c["href"].endswith("log.txt") == (r.status in ("crash", "timeout"))


def test_every_cell_is_present_and_links_its_job(tmp_path: Path) -> None:
    report = sample_fleet(tmp_path)
    paths = report.write(tmp_path)
    html = paths["html"].read_text()
    parser = _Cells()
    parser.feed(html)
    _check_cells(parser.cells, report, tmp_path)
    assert "<script" not in html and "http://" not in html  # self-contained
    # the slowest model first; the most drifted job first; the baseline run's change shown
    assert html.index("<th>b.onnx") < html.index("<th>a.onnx")
    drifted = html.split("<h2>Most drifted</h2>")[1].split("</table>")[0]
    assert drifted.index("b.onnx") < drifted.index("a.onnx")
    assert "(was fail)" in html and "<h2>Changed since the baseline run</h2>" in html


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium (Debian's chromium package) is not installed; .ci/run installs it")
    return exe


def test_dashboard_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    report = sample_fleet(tmp_path)
    page = report.write(tmp_path)["html"]
    dom = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--no-first-run", "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parser = _Cells()
    parser.feed(dom.stdout)  # the page as the browser built it
    _check_cells(parser.cells, report, tmp_path)

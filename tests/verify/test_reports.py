"""Report renderings: report.json (+ .npz tensors), junit.xml (schema-valid), summary.md, report.html."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuvil.verify.base import CheckResult, Status
from cuvil.verify.render import write_reports
from cuvil.verify.render.html import render_html
from cuvil.verify.render.markdown import render_markdown
from cuvil.verify.render.plots import plots_of
from cuvil.verify.report import Report

XSD = Path(__file__).with_name("junit.xsd")


def sample_report(strict: bool = False) -> Report:
    layers = [{"layer": i, "value": f"v{i}", "rel_l2": 10.0 ** (-7 + i), "threshold": 1e-4} for i in range(5)]
    results = [
        CheckResult("layerwise", Status.FAIL, "layer 4 exceeds its threshold", target="native",
                    figures={"max_rel_l2": 1e-3, "nan_figure": float("nan")}, details={"series": layers},
                    where={"layer": "v4", "node": "conv_4"},
                    tensors={"v4.compiled": np.arange(6, dtype=np.float32).reshape(2, 3)}),
        CheckResult("latency", Status.PASS, "1.2 ms median", target="native", figures={"median_ms": 1.2},
                    details={"breakdown": [{"name": "conv1", "cat": "kernel", "median_ms": 0.7},
                                           {"name": "copy-in", "cat": "copy-in", "median_ms": 0.1}]}),
        CheckResult("cross-target", Status.PASS, "drift within limits",
                    details={"labels": ["native", "ref", "float64"],
                             "matrix": [[0.0, 1e-7, 2e-7], [1e-7, 0.0, 1e-7], [2e-7, 1e-7, 0.0]]}),
        CheckResult("dynamic-shapes", Status.WARN, "symbol batch is unbounded | suggest 1:64", where={"symbol": "batch"}),
        CheckResult("precision", Status.SKIP, "target wasm32 is not available here", target="wasm32"),
        CheckResult("coverage", Status.FAIL, "the check crashed: KeyError: 'x'", target=None,
                    details={"error": {"type": "KeyError", "message": "'x'", "traceback": "Traceback ...\nKeyError"}}),
        CheckResult("batch-scaling", Status.PASS, "knee at 8", target="native",
                    details={"plots": [{"kind": "line", "title": "throughput", "series": [
                        {"name": "native", "x": [1, 2, 4, 8], "y": [10, 19, 35, 36]}]}],
                        "bars": {"bars": [{"label": "a | b", "value": 3}]}, "matrix": "not a matrix"}),
    ]
    return Report(model="models/m.onnx", targets=["ref", "native"], checks=[r.check for r in results],
                  results=results, strict=strict, environment={"hostname": "ci-1", "cuvil": "0.1.0"})


def test_counts_and_exit_status() -> None:
    r = sample_report()
    assert r.counts() == {"pass": 3, "fail": 2, "warn": 1, "skip": 1}
    assert r.exit_status == 1 and len(r.failed) == 2
    ok = Report("m", ["ref"], ["a"], [CheckResult("a", Status.WARN, "w"), CheckResult("a", Status.SKIP, "s")])
    assert ok.exit_status == 0
    ok.strict = True
    assert ok.exit_status == 1


def test_json_with_tensors_beside_it(tmp_path: Path) -> None:
    paths = write_reports(sample_report(), tmp_path)
    assert {p.name for p in paths.values()} == {"report.json", "junit.xml", "summary.md", "report.html"}
    text = paths["json"].read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert data["counts"]["fail"] == 2 and data["exit_status"] == 1
    lw = data["results"][0]
    assert lw["figures"]["nan_figure"] == "NaN" and lw["where"] == {"layer": "v4", "node": "conv_4"}
    assert lw["tensors"] == ["v4.compiled"] and "arange" not in text and "[0.0, 1.0" not in text
    with np.load(tmp_path / lw["tensors_file"]) as npz:
        np.testing.assert_array_equal(npz["v4.compiled"], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert "tensors_file" not in data["results"][1]


def _validate(path: Path) -> None:
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(XSD)).validate(str(path))


@pytest.mark.parametrize("strict", [False, True])
def test_junit_is_schema_valid_and_maps_statuses(tmp_path: Path, strict: bool) -> None:
    path = write_reports(sample_report(strict), tmp_path)["junit"]
    _validate(path)
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["layerwise[native]", "latency[native]", "cross-target", "dynamic-shapes",
                           "precision[wasm32]", "coverage", "batch-scaling[native]"]
    assert cases["layerwise[native]"].find("failure") is not None
    assert cases["coverage"].find("error") is not None and cases["coverage"].find("failure") is None
    assert cases["precision[wasm32]"].find("skipped") is not None
    assert (cases["dynamic-shapes"].find("failure") is not None) == strict
    assert "WARNING:" in (cases["dynamic-shapes"].findtext("system-out") or "")
    assert suite.get("failures") == str(2 if strict else 1) and suite.get("errors") == "1"
    assert suite.get("skipped") == "1" and suite.get("tests") == "7"


def test_the_junit_schema_rejects_malformed_files(tmp_path: Path) -> None:
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(XSD))
    good = '<testsuites><testsuite name="s" tests="1"><testcase name="a" time="0.5"/></testsuite></testsuites>'
    assert schema.is_valid(good)
    assert not schema.is_valid(good.replace(' name="a"', ""))             # a test case needs a name
    assert not schema.is_valid(good.replace('time="0.5"', 'time="1e-3"'))  # times are plain decimals
    assert not schema.is_valid(good.replace("<testcase", "<failure/><testcase"))  # failures live in test cases


def test_markdown_summary() -> None:
    md = render_markdown(sample_report())
    assert md.startswith("## ❌ cuvil verify: `models/m.onnx`")
    assert "**FAIL: 3 pass, 1 warn, 2 fail, 1 skip**" in md
    attention = md.split("### Needs attention")[1].split("### Results")[0]
    assert "**layerwise** on `native`: layer 4 exceeds its threshold" in attention
    assert "layer `v4`, node `conv_4`" in attention and "💥 error **coverage**" in attention
    assert "| batch-scaling | native | ✅ pass | knee at 8 |" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and ln.endswith(" s |")]
    assert len(rows) == 7 and all(len(re.findall(r"(?<!\\)\|", ln)) == 7 for ln in rows)  # pipes in text escaped
    assert "unbounded \\| suggest" in md


def test_plot_conventions() -> None:
    r = sample_report().results
    kinds = [[p["kind"] for p in plots_of(x.details)[0]] for x in r]
    assert kinds[0] == ["line"] and kinds[1] == ["bars"] and kinds[2] == ["matrix"]
    layer_plot = plots_of(r[0].details)[0][0]
    assert layer_plot["log_y"] and [s["name"] for s in layer_plot["series"]] == ["rel_l2", "threshold"]
    assert layer_plot["x_ticks"] == ["v0", "v1", "v2", "v3", "v4"]
    plots, notes = plots_of(r[6].details)
    assert [p["kind"] for p in plots] == ["line", "bars"]
    assert len(notes) == 1 and "details['matrix']" in notes[0]


def test_html_is_self_contained_with_plots() -> None:
    page = render_html(sample_report())
    assert page.count('<svg class="plot plot-line"') == 2 and page.count('class="plot plot-bars"') == 2
    assert page.count('class="plot plot-matrix"') == 1
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "src=" not in page and "<link" not in page
    assert "a | b" in page and "KeyError" in page and "left out" in page


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("headless Chromium (Debian's chromium package) is not installed; .ci/run installs it")
    return exe


def _run_chromium(exe: str, *args: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--no-first-run", *map(str, args)], capture_output=True, text=True, timeout=120)


def _png_pixels(path: Path) -> np.ndarray:
    """The RGB(A) pixels of a non-interlaced 8-bit PNG (what Chromium writes)."""
    import struct
    import zlib

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    h = depth = color = 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    assert depth == 8 and color in (2, 6)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    out = np.zeros((h, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, np.int32)
        for x in range(stride):
            a = cur[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + pred) & 0xFF
        out[y], prev = cur, cur
    return out.reshape(h, w, bpp)[:, :, :3]


def test_html_renders_in_headless_chromium(tmp_path: Path) -> None:
    exe = _chromium()
    html = write_reports(sample_report(), tmp_path)["html"]
    dom = _run_chromium(exe, "--dump-dom", html.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="plot plot-line"') == 2 and dom.stdout.count('class="plot plot-matrix"') == 1
    assert "<polyline" in dom.stdout and 'class="bar"' in dom.stdout and 'class="cell"' in dom.stdout
    # the plots are drawn: a screenshot of the page holding only the first plot is not blank
    only = tmp_path / "plot.html"
    start = html.read_text().index('<svg class="plot plot-line"')
    svg = html.read_text()[start:].split("</svg>", 1)[0] + "</svg>"
    only.write_text(f"<!DOCTYPE html><html><body style='margin:0'>{svg}</body></html>")
    shot = tmp_path / "shot.png"
    r = _run_chromium(exe, f"--screenshot={shot}", "--window-size=700,320", only.resolve().as_uri())
    assert r.returncode == 0 and shot.is_file(), r.stderr[-2000:]
    px = _png_pixels(shot)
    colored = (np.abs(px - px[:, :, :1]).max(axis=2) > 40).sum()  # the series' colour, not grey or white
    assert colored > 200, f"only {colored} coloured pixels: the chart was not drawn"

"""``--subject onnxruntime``: the checks that apply to an onnxruntime session, run on it; the rest skipped.

Also the command-line options that configure checks: ``--trace FILE`` (the latency check's Chrome
trace) and ``--memory-limit SIZE`` (the batch-scaling check's limit).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import cuvil
from cuvil.cli import main
from cuvil.verify.base import Status, VerifyError
from cuvil.verify.config import parse_size
from cuvil.verify.onnxruntime_subject import APPLIES
from tests.support.paths import REPO

TINY_CNN = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def ort_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ort")


@pytest.fixture(scope="module")
def ort_report(ort_work: Path) -> cuvil.verify.Report:
    work = ort_work
    return cuvil.verify(str(TINY_CNN), subject="onnxruntime", work_dir=work, trace=work / "trace.json",
                        config={"checks": {"latency": {"min_runs": 5, "min_seconds": 0.05},
                                           "batch-scaling": {"max_batch": 4}}})


def test_the_report_says_it_verified_onnxruntime(ort_report: cuvil.verify.Report) -> None:
    assert ort_report.subject == "onnxruntime" and ort_report.targets == ["onnxruntime"]
    assert ort_report.exit_status == 0, ort_report.verdict
    for r in ort_report.results:
        if r.check in APPLIES:
            assert r.status is not Status.SKIP and r.target == "onnxruntime", (r.check, r.summary)
        else:
            assert r.status is Status.SKIP and "does not apply to onnxruntime" in r.summary, (r.check, r.summary)


def test_precision_and_layerwise_judge_the_session_against_the_float64_reference(
        ort_report: cuvil.verify.Report, ort_work: Path) -> None:
    by = {r.check: r for r in ort_report.results}
    prec = by["precision"]
    assert prec.status is Status.PASS and 0 < prec.figures["rel_l2"] < 1e-5
    lw = by["layerwise"]
    assert lw.status is Status.PASS and lw.details["oracle"] == "reference interpreter (float64)"
    assert lw.figures["layers"] >= 3 and lw.details["tap_changed_outputs"] == []
    # the layers are the model's values that ORT's optimised graph (saved by the session) still computes:
    # which they are depends on the CPU (a fused conv+relu computes r1 directly; the NCHWc blocks it uses
    # on some CPUs hide it)
    import onnx

    model_values = {o for n in onnx.load(str(TINY_CNN)).graph.node for o in n.output}
    optimized = onnx.load(str(ort_work / "onnxruntime-optimized.onnx"), load_external_data=False)
    still = [o for n in optimized.graph.node for o in n.output if o in model_values]
    values = [e["value"] for e in lw.details["series"]]
    assert values == still and values[-1] == "probs"


def test_latency_is_decomposed_by_onnxruntime_s_profiler(ort_report: cuvil.verify.Report, tmp_path: Path) -> None:
    lat = next(r for r in ort_report.results if r.check == "latency")
    names = [b["name"] for b in lat.details["breakdown"]]
    assert any(n.endswith("(Conv)") for n in names) and any(n.endswith("(Softmax)") for n in names)
    assert {"session overhead", "call overhead"} <= set(names)
    assert lat.figures["kernels_median_ms"] > 0 and lat.figures["profiled_median_ms"] >= lat.figures["kernels_median_ms"]


def test_dynamic_shapes_reports_what_onnxruntime_accepts(ort_report: cuvil.verify.Report) -> None:
    dyn = next(r for r in ort_report.results if r.check == "dynamic-shapes")
    # ONNX declares no range for batch: the session runs every value, and the missing maximum is a warning
    assert dyn.status is Status.WARN and dyn.where == {"symbol": "batch"}
    assert all("rel_l2" in run and run["rel_l2"] < 1e-5 for run in dyn.details["runs"])


def test_subject_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="Cuvil targets"):
        cuvil.verify(str(TINY_CNN), subject="onnxruntime", targets=["native"], work_dir=tmp_path)
    graph = cuvil.api.import_model(str(TINY_CNN))
    with pytest.raises(VerifyError, match="verifies ONNX models"):
        cuvil.verify(graph, subject="onnxruntime", work_dir=tmp_path)


def test_trace_and_memory_limit_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "cuvil.toml"
    cfg.write_text("[checks.latency]\nmin_runs = 3\nmin_seconds = 0.01\n[checks.batch-scaling]\nmax_batch = 64\n")
    trace = tmp_path / "t" / "trace.json"
    argv = ["verify", str(TINY_CNN), "--checks", "latency,batch-scaling", "--targets", "native", "-q",
            "--config", str(cfg), "--trace", str(trace), "--memory-limit", "2MiB", "--report-dir", str(tmp_path / "r")]
    assert main(argv) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["cat"] == "kernel" for e in events)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    scaling = next(r for r in report["results"] if r["check"] == "batch-scaling")
    assert scaling["details"]["memory_limit"] == 2 << 20 and scaling["details"]["stopped_by"] == "memory limit"
    capsys.readouterr()
    assert main([*argv[:-2], "--memory-limit", "lots"]) == 2
    assert "memory_limit must be a size" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [("2GiB", 2 << 30), ("512M", 512 << 20), ("4096", 4096), ("64KB", 64 << 10),
                                        (1000, 1000)])
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size

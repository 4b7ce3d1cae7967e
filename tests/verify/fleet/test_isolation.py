"""A job's process and how it ended: exit statuses, signals, time and memory limits, as job results;
and the progress lines of a sweep."""

from __future__ import annotations

import io
import signal
from pathlib import Path

import onnx
import pytest
from onnx import helper, numpy_helper

from cuvil.verify.fleet.isolation import classify, run_job
from cuvil.verify.fleet.jobs import Job, JobResult, drift_of
from cuvil.verify.fleet.progress import FleetProgress
from tests.verify.models import f32, onnx_model


def _job(**kw: object) -> Job:
    fields: dict[str, object] = {"model": "m.onnx", "source": "/m.onnx", "target": "native", "checks": "compat",
                                 "key": "k" * 24, "digest": "d", "timeout": 4.0, "memory": 1 << 30, "settings": {}}
    fields.update(kw)
    return Job(**fields)  # type: ignore[arg-type]


def test_how_a_process_ended_is_the_job_status() -> None:
    job = _job()
    ok = {"exit_status": 0, "verdict": "PASS: 1 pass", "counts": {"pass": 1},
          "results": [{"check": "precision", "target": "native", "status": "pass", "summary": "fine"}],
          "figures": {"precision.fp32_rel_l2": 3e-8, "precision.floor_rel_l2": 9.0}}
    r = classify(job, 0, False, 1.0, ok, "")
    assert (r.status, r.signature, r.drift) == ("pass", None, 3e-8)  # the floor is no drift
    bad = {**ok, "exit_status": 1, "results": [{**ok["results"][0], "status": "fail", "summary": "too far"}]}
    assert classify(job, 1, False, 1.0, bad, "").status == "fail"
    assert "precision: too far" in classify(job, 1, False, 1.0, bad, "").summary
    crash = classify(job, -signal.SIGSEGV, False, 1.0, None, "Fatal Python error: Segmentation fault")
    assert (crash.status, crash.signature) == ("crash", "SIGSEGV")
    assert classify(job, -signal.SIGABRT, False, 1.0, None, "").signature == "SIGABRT"
    hang = classify(job, -signal.SIGTERM, True, 4.1, None, "")
    assert (hang.status, hang.signature) == ("timeout", "timeout after 4 s")
    oom = classify(job, 1, False, 1.0, {**bad, "memory": True, "results": [
        {"check": "precision", "status": "fail", "summary": "crashed", "error": "MemoryError"}]}, "")
    assert (oom.status, oom.signature) == ("memory", "MemoryError") and "1 GiB" in oom.summary
    assert classify(job, 3, False, 1.0, None, "MemoryError").status == "memory"
    assert classify(job, -signal.SIGABRT, False, 1.0, None, "terminate called after std::bad_alloc").status == "memory"
    usage = classify(job, 2, False, 1.0, {"exit_status": 2, "error": "VerifyError: m.onnx: no such file"}, "")
    assert (usage.status, usage.summary) == ("error", "VerifyError: m.onnx: no such file")
    gone = classify(job, 1, False, 1.0, None, "Traceback ...\nImportError: no module named x\n")
    assert gone.status == "crash" and "ImportError: no module named x" in gone.summary


def test_drift_is_the_largest_drift_or_error_figure() -> None:
    assert drift_of({"cross-target.max_drift": 2e-7, "precision.fp32_rel_l2": 3e-8, "latency.median_ms": 5.0}) == 2e-7
    assert drift_of({"latency.median_ms": 5.0}) is None


def _runaway(path: Path) -> Path:
    """y = x expanded to 30000 x 30000 floats (3.6 GB, 7.2 GB in float64): more than its job may take."""
    shape = numpy_helper.from_array(__import__("numpy").array([30000, 30000], "int64"), "shape")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["y"], name="grow")]
    onnx.save(onnx_model(nodes, [f32("x", [1, 1])], [f32("y", [30000, 30000])], [shape]), path)
    return path


def test_a_runaway_allocation_is_a_memory_failure_of_its_job_only(tmp_path: Path) -> None:
    model = _runaway(tmp_path / "grow.onnx")
    job = _job(model="grow.onnx", source=str(model), target="ref", checks="precision", timeout=120.0,
               memory=1 << 30, settings={"thresholds": {"precision": {"precisions": ["fp32"]}}})
    r = run_job(job, tmp_path / "job", str(tmp_path / "cache"))
    assert r.status == "memory", (r.status, r.summary, r.log_tail)
    assert (tmp_path / "job" / "log.txt").is_file()


def test_progress_lines_count_and_estimate(tmp_path: Path) -> None:
    out = io.StringIO()
    p = FleetProgress(out)
    jobs = [_job(key=f"{i:024d}", model=f"m{i}.onnx") for i in range(4)]
    p.begin(5, 4, "local", 2)
    p.started(jobs[0])
    p.started(jobs[1])
    assert p.eta() is None
    p.finished(JobResult(jobs[0].key, "m0.onnx", "native", "compat", "pass", "ok", 2.0))
    p.finished(JobResult(jobs[1].key, "m1.onnx", "native", "compat", "crash", "died", 4.0, signature="SIGSEGV"))
    assert p.eta() == pytest.approx(3.0 * 2 / 2)  # mean 3 s, 2 queued, 2 at a time
    lines = out.getvalue().splitlines()
    assert lines[0] == "[fleet] 5 jobs: 4 to run, 1 from the results folder; local executor, 2 at a time"
    assert lines[1] == "[fleet] start m0.onnx [native] compat"
    assert lines[-1].startswith("[fleet] CRASH   m1.onnx [native] compat [SIGSEGV] (4.0 s) | 3/5 done, 1 failed, "
                                "0 running, 2 queued, about 3 s left")


def test_a_check_crashed_by_a_failed_allocation_counts_as_memory() -> None:
    from cuvil.verify.base import CheckResult, Status
    from cuvil.verify.fleet.job import _error

    def crashed(kind: str, message: str) -> CheckResult:
        return CheckResult("precision", Status.FAIL, "crashed", details={"error": {"type": kind, "message": message}})

    # wasmtime's reservation of a module's memory under RLIMIT_AS, the interpreter wrapping a MemoryError
    assert _error(crashed("RunError", "mmap failed to reserve 0x104000000 bytes\nCannot allocate memory")) == {
        "error": "MemoryError"}
    assert _error(crashed("InterpreterError", "node 'grow' failed: MemoryError: Unable to allocate")) == {
        "error": "MemoryError"}
    assert _error(crashed("ValueError", "bad shape")) == {"error": "ValueError"}
    assert _error(CheckResult("precision", Status.FAIL, "too far")) == {}

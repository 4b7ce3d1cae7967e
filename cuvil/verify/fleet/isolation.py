"""Running one job in a process of its own, under its limits, and reading how it ended.

The job process (``python -m cuvil.verify.fleet.job``, cuvil/verify/fleet/job.py) starts in a
session of its own, so the job and anything it started are one process group: at the time
limit, or when the sweep is cancelled, the group gets SIGTERM and, a moment later, SIGKILL.  The
memory limit is the job's own ``RLIMIT_AS``.  How it ended is the job's result:

- exit 0 / 1 / 2: ``pass`` / ``fail`` / ``error`` (cuvil verify's statuses, read from ``outcome.json``);
- killed at the time limit: ``timeout`` ("timeout after 4 s");
- out of its memory limit (a MemoryError, or an allocator's message in the log): ``memory``;
- died of a signal (SIGSEGV, SIGABRT, SIGBUS ...) or exited without an outcome: ``crash``.

This module is what both executors run for a job: the local one in a thread per running job, the
Ray one inside a Ray task on whichever node runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cuvil.verify.fleet.jobs import MEMORY_MARKS, Job, JobResult, drift_of

GRACE_SECONDS = 2.0  # between SIGTERM and SIGKILL
POLL_SECONDS = 0.1
LOG_TAIL = 2000


class JobCancelledError(Exception):
    """The sweep was cancelled while the job ran (its process group is gone)."""


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the job's process group: SIGTERM, then SIGKILL after a grace period."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                with contextlib.suppress(ProcessLookupError):  # children of the job that outlived it
                    os.killpg(pgid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue
    proc.wait()


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


def _tail(log: Path) -> str:
    try:
        data = log.read_bytes()
    except OSError:
        return ""
    return data[-LOG_TAIL:].decode("utf-8", errors="replace")


def classify(job: Job, returncode: int, timed_out: bool, seconds: float, outcome: dict[str, Any] | None,
             log_tail: str) -> JobResult:
    """The job's result from how its process ended (see the module docstring)."""
    node = platform.node()
    base: dict[str, Any] = {"key": job.key, "model": job.model, "target": job.target, "checks": job.checks, "seconds": seconds,
            "exit_code": returncode, "node": node, "log_tail": log_tail}
    if timed_out:
        return JobResult(**base, status="timeout", signature=f"timeout after {job.timeout:g} s",
                         summary=f"killed after its time limit of {job.timeout:g} s (a hang)")
    memory_mark = next((m for m in MEMORY_MARKS if m in log_tail), None)
    if outcome is not None and returncode in (0, 1, 2):
        figures = {str(k): float(v) for k, v in (outcome.get("figures") or {}).items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        counts = {str(k): int(v) for k, v in (outcome.get("counts") or {}).items()}
        results = list(outcome.get("results") or [])
        if outcome.get("memory"):
            short: dict[str, Any] = next((r for r in results if r.get("error") == "MemoryError"), {})
            return JobResult(**base, status="memory", signature="MemoryError", counts=counts, results=results,
                             figures=figures, summary=f"{short.get('check', 'a check')} ran out of the memory "
                                                      f"limit ({_size(job.memory)})")
        if returncode == 2:
            return JobResult(**base, status="error", signature="usage or input error",
                             summary=str(outcome.get("error", "a usage or input error")))
        status = "pass" if returncode == 0 else "fail"
        failed = [r for r in results if r.get("status") == "fail" or (r.get("status") == "warn" and status == "fail")]
        summary = str(outcome.get("verdict", ""))
        if failed:
            summary += f"; {failed[0]['check']}: {failed[0]['summary']}"
        return JobResult(**base, status=status, summary=summary, counts=counts, results=results, figures=figures,
                         drift=drift_of(figures))
    if returncode == 3 or memory_mark is not None:  # job.py's exit for a MemoryError outside a check
        return JobResult(**base, status="memory", signature=memory_mark or "MemoryError",
                         summary=f"ran out of its memory limit ({_size(job.memory)})")
    if returncode < 0:
        name = _signal_name(-returncode)
        return JobResult(**base, status="crash", signature=name, summary=f"the job process died of {name}")
    last = next((line for line in reversed(log_tail.strip().splitlines()) if line.strip()), "")
    return JobResult(**base, status="crash", signature=f"exit status {returncode}",
                     summary=f"the job process exited with status {returncode} and no outcome: {last[:200]}")


def _size(n: int | None) -> str:
    if n is None:
        return "the node's RAM"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


def run_job(job: Job, folder: Path, cache_dir: str | None, cancel: threading.Event | None = None) -> JobResult:
    """Run ``job`` in a fresh process writing into ``folder`` (spec.json, log.txt, outcome.json, report/)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in ("outcome.json", "result.json"):
        (folder / stale).unlink(missing_ok=True)
    shutil.rmtree(folder / "report", ignore_errors=True)
    spec = folder / "spec.json"
    spec.write_text(json.dumps({"job": job.to_json(), "out": str(folder.resolve()), "cache_dir": cache_dir},
                               indent=1) + "\n", encoding="utf-8")
    log_path = folder / "log.txt"
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cuvil.verify.fleet.job", str(spec.resolve())],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            while True:
                try:
                    returncode = proc.wait(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:
                    if cancel is not None and cancel.is_set():
                        kill_group(proc)
                        raise JobCancelledError(job.label) from None
                    if time.monotonic() - t0 > job.timeout:
                        timed_out = True
                        kill_group(proc)
                        returncode = proc.wait()
                        break
        except BaseException:  # Ctrl-C, a Ray cancel: the job's processes go with the sweep
            kill_group(proc)
            raise
    seconds = time.monotonic() - t0
    outcome: dict[str, Any] | None = None
    try:
        outcome = json.loads((folder / "outcome.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        outcome = None
    return classify(job, returncode, timed_out, seconds, outcome, _tail(log_path))

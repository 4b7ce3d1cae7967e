"""Progress across a sweep, as plain lines (CI logs keep every one): queued, started, finished,
with the running counts and an estimate of the time left.

    [fleet] 12 jobs: 10 to run, 2 from the results folder; local executor, 2 at a time
    [fleet] start a.onnx [native] compat
    [fleet] PASS  a.onnx [native] compat (1.4 s) | 3/12 done, 0 failed, 2 running, 7 queued, about 9 s left

The estimate is the mean time of the jobs finished in this sweep times the jobs left, over the
jobs run at a time; "unknown" until a job finished.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from cuvil.verify.fleet.jobs import Job, JobResult


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class FleetProgress:
    """Counts of a sweep's jobs and the lines that report them (thread-safe: executors call it from
    their threads)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._lock = threading.Lock()
        self.total = self.queued = self.running = self.done = self.failed = 0
        self._seconds = 0.0
        self._finished_here = 0
        self.parallel = 1
        self._t0 = time.monotonic()

    def _line(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"[fleet] {text}\n")
        stream.flush()

    def begin(self, total: int, to_run: int, executor: str, parallel: int) -> None:
        with self._lock:
            self.total, self.queued, self.parallel = total, to_run, max(1, parallel)
            self.done = total - to_run
            how = f"{executor} executor, {parallel} at a time" if parallel else "nothing to run"
            self._line(f"{total} jobs: {to_run} to run, {total - to_run} from the results folder; {how}")

    def resumed(self, result: JobResult) -> None:
        with self._lock:
            if not result.ok:
                self.failed += 1

    def started(self, job: Job) -> None:
        with self._lock:
            self.queued -= 1
            self.running += 1
            self._line(f"start {job.label}")

    def finished(self, result: JobResult) -> None:
        with self._lock:
            self.running -= 1
            self.done += 1
            self._finished_here += 1
            self._seconds += result.seconds
            if not result.ok:
                self.failed += 1
            sig = f" [{result.signature}]" if result.signature else ""
            self._line(f"{result.status.upper():7s} {result.model} [{result.target}] {result.checks}{sig} "
                       f"({result.seconds:.1f} s) | {self._counts()}")

    def dropped(self, jobs: list[Job], why: str) -> None:
        with self._lock:
            self.queued -= len(jobs)
            self._line(f"{len(jobs)} queued jobs not run: {why}")

    def eta(self) -> float | None:
        """Seconds left by the mean of this sweep's finished jobs (None before one finished)."""
        if not self._finished_here:
            return None
        left = self.queued + self.running / 2
        return self._seconds / self._finished_here * left / self.parallel

    def _counts(self) -> str:
        eta = self.eta()
        left = "unknown time left" if eta is None else f"about {_duration(eta)} left"
        return (f"{self.done}/{self.total} done, {self.failed} failed, {self.running} running, {self.queued} queued, "
                f"{left}")

    def end(self, verdict: str) -> None:
        with self._lock:
            self._line(f"{verdict} in {_duration(time.monotonic() - self._t0)}")

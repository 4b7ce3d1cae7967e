"""A sweep: the fleet's jobs planned, the ones already done taken from the results folder
(``resume``), the rest handed to an executor, each result stored as it arrives, and the report.

Executors (cuvil/verify/fleet/executor_local.py, executor_ray.py) only run jobs: they call
:meth:`Sweep.started` and :meth:`Sweep.finished` and stop starting jobs once :attr:`Sweep.stopping`
(``max_failures`` jobs failed).  Storing a result the moment it arrives is what makes a sweep
that is killed resumable: ``--resume`` loses at most the jobs that were running.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TextIO

from cuvil.verify.base import VerifyError
from cuvil.verify.fleet.jobs import Job, JobResult, ResultStore, plan_jobs
from cuvil.verify.fleet.progress import FleetProgress
from cuvil.verify.fleet.report import FleetReport, load_previous
from cuvil.verify.fleet.spec import Fleet, load_fleet

EXECUTORS = ("local", "ray")


class Executor(Protocol):
    name: str

    def start(self) -> int:
        """Make ready to run jobs (Ray: connect, or start a local cluster); returns how many run at a time."""
        ...

    def stop(self) -> None:
        """Release what :meth:`start` took (a local Ray cluster it started)."""
        ...

    def run(self, todo: Sequence[Job], store: ResultStore, cache_dir: str | None, sweep: Sweep) -> None: ...


def failed_to_run(job: Job, why: str) -> JobResult:
    """The result of a job whose process could not be started or whose result did not come back."""
    return JobResult(key=job.key, model=job.model, target=job.target, checks=job.checks, status="error",
                     summary=f"the job could not be run: {why}", seconds=0.0, signature="not run",
                     node=platform.node())


class Sweep:
    """The results of one sweep as they arrive, stored in the results folder at once."""

    def __init__(self, store: ResultStore, progress: FleetProgress, max_failures: int | None) -> None:
        self.store = store
        self.progress = progress
        self.max_failures = max_failures
        self.results: dict[str, JobResult] = {}
        self.not_run: list[Job] = []
        self.failures = 0

    @property
    def stopping(self) -> bool:
        return self.max_failures is not None and self.failures >= self.max_failures

    def started(self, job: Job) -> None:
        self.progress.started(job)

    def finished(self, result: JobResult) -> None:
        self.store.save(result)
        self.results[result.key] = result
        if not result.ok:
            self.failures += 1
        self.progress.finished(result)

    def dropped(self, jobs: list[Job]) -> None:
        self.not_run.extend(jobs)
        self.progress.dropped(jobs, f"--max-failures {self.max_failures} reached")


def make_executor(executor: str, jobs: int | None, ray_address: str | None, fleet: Fleet) -> Executor:
    if executor == "local":
        from cuvil.verify.fleet.executor_local import LocalExecutor

        if ray_address is not None:
            raise VerifyError("--ray-address applies with --executor ray")
        return LocalExecutor(jobs)
    if executor == "ray":
        from cuvil.verify.fleet.executor_ray import RayExecutor

        return RayExecutor(ray_address, jobs, fleet.resources)
    raise VerifyError(f"unknown executor {executor!r} (known: {', '.join(EXECUTORS)})")


def run_fleet(fleet_file: str | Path, *, executor: str = "local", jobs: int | None = None,
              ray_address: str | None = None, report_dir: str | Path = "fleet-report", resume: bool = False,
              max_failures: int | None = None, baseline_run: str | Path | None = None, cache_dir: str | None = None,
              progress: TextIO | None = None) -> FleetReport:
    """Verify every job of the fleet file; see ``cuvil.verify_fleet``."""
    if jobs is not None and jobs < 1:
        raise VerifyError(f"--jobs must be at least 1, got {jobs}")
    if max_failures is not None and max_failures < 1:
        raise VerifyError(f"--max-failures must be at least 1, got {max_failures}")
    fleet = load_fleet(fleet_file)
    out = Path(report_dir)
    previous = load_previous(baseline_run, out)  # the trends' baseline: read before this sweep rewrites fleet.json
    run = make_executor(executor, jobs, ray_address, fleet)
    store = ResultStore(out)
    planned = plan_jobs(fleet)
    shown = FleetProgress(progress)
    sweep = Sweep(store, shown, max_failures)
    todo: list[Job] = []
    resumed: dict[str, JobResult] = {}
    for job in planned:
        stored = store.load(job.key) if resume else None
        if stored is None:
            todo.append(job)
        else:
            stored.resumed = True
            resumed[job.key] = stored
    t0 = time.monotonic()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sweep.failures = sum(not r.ok for r in resumed.values())
    cancelled = False
    started_executor = bool(todo) and not sweep.stopping
    try:
        shown.begin(len(planned), len(todo), run.name, run.start() if started_executor else 0)
        for r in resumed.values():
            shown.resumed(r)
        if sweep.stopping:
            sweep.dropped(list(todo))
        elif todo:
            run.run(todo, store, cache_dir, sweep)
    except KeyboardInterrupt:  # the executor ended its running jobs; what finished is stored and reported
        cancelled = True
    finally:
        if started_executor:
            run.stop()
    results = {**resumed, **sweep.results}
    report = FleetReport(fleet=str(fleet.path), executor=run.name, started=started, seconds=time.monotonic() - t0,
                         jobs=planned, results=[results[j.key] for j in planned if j.key in results],
                         not_run=[j for j in planned if j.key not in results], previous=previous, store=store,
                         why_not_run="the sweep was cancelled" if cancelled else f"--max-failures {max_failures} reached")
    report.write(out)
    if cancelled:
        shown.end(f"cancelled: {len(results)} of {len(planned)} jobs done (kept in {out}; --resume goes on)")
        raise KeyboardInterrupt
    shown.end(report.verdict)
    return report

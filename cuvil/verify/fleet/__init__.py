"""Verifying a fleet of models: many models, many targets, one report (``cuvil verify-fleet``).

    import cuvil

    report = cuvil.verify_fleet("fleet.toml", jobs=4, report_dir="fleet-report", resume=True)
    print(report.verdict)          # "FAIL: 12 of 12 jobs: 10 pass, 1 fail, 1 crash"
    raise SystemExit(report.exit_status)

The fleet file (spec.py) lists models and, for each, targets and check groups; every (model,
target, check group) is a job (jobs.py) with a content-addressed key, run by the existing
``cuvil verify`` in a process of its own under a time and memory limit (job.py, isolation.py), over
this machine's cores (executor_local.py) or a Ray cluster (executor_ray.py).  Results are kept in
the results folder under their keys, so ``resume`` re-runs only what changed; the report
(report.py, dashboard.py) covers the whole fleet.  docs/fleet.md has the cluster set-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from cuvil.verify.fleet.report import FleetReport
from cuvil.verify.fleet.spec import Fleet, ModelEntry, load_fleet


def verify_fleet(
    fleet: str | Path,
    *,
    executor: str = "local",
    jobs: int | None = None,
    ray_address: str | None = None,
    report_dir: str | Path = "fleet-report",
    resume: bool = False,
    max_failures: int | None = None,
    baseline_run: str | Path | None = None,
    cache_dir: str | Path | None = None,
    progress: TextIO | None = None,
) -> FleetReport:
    """Verify every (model, target, check group) job of the fleet file ``fleet``; return the FleetReport.

    ``executor``: ``"local"`` (processes on this machine, ``jobs`` at a time; default every core
    this process may use) or ``"ray"`` (Ray tasks; ``ray_address`` joins a running cluster,
    ``"auto"`` or ``"ray://HOST:10001"``, else a local one is started unless Ray is connected
    already; ``jobs`` caps the tasks in flight). ``report_dir``: the results folder (each job's
    result and full cuvil verify report under ``jobs/KEY/``) and the fleet report (fleet.json,
    junit.xml, summary.md, index.html). ``resume``: take the stored result of every job whose key
    the folder holds. ``max_failures``: start no job after that many failed. ``baseline_run``: the
    fleet.json the dashboard's trends compare with (default: the folder's own from its last
    sweep). ``cache_dir``: the build cache (on Ray: a path on each node). ``progress``: where the
    progress lines go (default stderr).

    A bad fleet file or argument raises :class:`cuvil.verify.VerifyError` before any job runs; a
    job that fails, crashes, hangs or runs out of memory is a result, never an exception."""
    from cuvil.verify.fleet.sweep import run_fleet

    return run_fleet(fleet, executor=executor, jobs=jobs, ray_address=ray_address, report_dir=report_dir,
                     resume=resume, max_failures=max_failures, baseline_run=baseline_run,
                     cache_dir=None if cache_dir is None else str(cache_dir), progress=progress)


__all__ = ["Fleet", "FleetReport", "ModelEntry", "load_fleet", "verify_fleet"]

"""``--executor local``: the sweep's jobs over this machine's cores, one job process per core.

A thread per running job waits on its process (cuvil/verify/fleet/isolation.py), so a job that
crashes, hangs or runs out of memory ends only itself.  Ctrl-C (KeyboardInterrupt in the driver)
kills every running job's process group before it propagates; jobs not started are not started.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

from cuvil.verify.fleet.isolation import run_job
from cuvil.verify.fleet.jobs import Job, JobResult, ResultStore
from cuvil.verify.fleet.sweep import Sweep, failed_to_run


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class LocalExecutor:
    """Runs jobs as processes on this machine, ``jobs`` at a time (default: every core it may use)."""

    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs if jobs is not None else default_jobs()

    def start(self) -> int:
        return self.jobs

    def stop(self) -> None:
        pass

    def run(self, todo: Sequence[Job], store: ResultStore, cache_dir: str | None, sweep: Sweep) -> None:
        queue = deque(todo)
        cancel = threading.Event()
        running: dict[Future[JobResult], Job] = {}
        with ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="cuvil-fleet") as pool:
            try:
                while queue or running:
                    while queue and len(running) < self.jobs and not sweep.stopping:
                        job = queue.popleft()
                        sweep.started(job)
                        running[pool.submit(run_job, job, store.job_dir(job.key), cache_dir, cancel)] = job
                    if sweep.stopping and queue:
                        sweep.dropped(list(queue))
                        queue.clear()
                    done, _ = wait(running, timeout=0.5, return_when=FIRST_COMPLETED)
                    for future in done:
                        job = running.pop(future)
                        try:
                            result = future.result()
                        except OSError as exc:  # the job process could not be started or its files written
                            result = failed_to_run(job, f"{type(exc).__name__}: {exc}")
                        sweep.finished(result)
            except KeyboardInterrupt:
                cancel.set()  # each waiting thread kills its job's process group and returns
                wait(running)
                raise

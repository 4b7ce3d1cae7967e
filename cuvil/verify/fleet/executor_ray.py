"""``--executor ray``: the sweep's jobs as Ray tasks on a cluster (``pip install 'cuvil[ray]'``).

Each job is one task that declares what it needs: ``num_cpus=1`` (or the fleet file's
``[resources.TARGET]``), ``num_gpus`` from there or from the target (``Backend.gpus``: 1 for
``cuda``), and one custom resource per CPU feature its target's code needs (``Backend.required_features()``: ``avx512f`` ... for
``x86_avx512``), so it is placed only on a node that advertises them (``ray start --resources``;
:func:`node_resources` says what this machine can advertise).  On its node the task runs the
job's process exactly as the local executor does (cuvil/verify/fleet/isolation.py) in a
node-local folder and returns the result and that folder (the report, the log) as a gzipped tar,
which the driver unpacks into its results folder: no shared file system is needed.  Builds are
cached per node (each node's own build cache, or the ``cache_dir`` given, on that node).

With no ``address`` and no Ray connection already made, a local cluster of this machine is
started (and stopped at the end); ``address="auto"`` or ``ray://HOST:10001`` joins a running one.
Ctrl-C cancels the tasks in flight: each task's job process group is killed on its node.
"""

from __future__ import annotations

import io
import platform
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cuvil.verify.base import VerifyError
from cuvil.verify.fleet.jobs import Job, JobResult, ResultStore, digest_of, source_file
from cuvil.verify.fleet.sweep import Sweep, failed_to_run

#: A task asks for this much of each CPU-feature resource: a node advertising 1000 runs any number.
FEATURE_AMOUNT = 0.001
NODE_FEATURE_AMOUNT = 1000


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise VerifyError("--executor ray needs Ray: pip install 'cuvil[ray]'") from None
    return ray


def required_resources(target: str) -> dict[str, float]:
    """The custom Ray resources a job on ``target`` asks for: one per CPU feature its code needs."""
    from cuvil.backends.registry import get_backend

    return {feature: FEATURE_AMOUNT for feature in sorted(get_backend(target).required_features())}


def node_resources() -> dict[str, float]:
    """The CPU-feature resources this machine can advertise to Ray: every feature a registered
    target needs that this CPU has (``ray start --resources`` takes them as JSON)."""
    from cuvil.backends.c.toolchain import cpu_flags
    from cuvil.backends.registry import backends

    have = cpu_flags()
    needed = {f for b in backends() for f in b.required_features()}
    return {f: float(NODE_FEATURE_AMOUNT) for f in sorted(needed & have)}


def task_options(target: str, resources: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``.options()`` of a job's task on ``target``: CPUs, GPUs, custom resources."""
    from cuvil.backends.registry import get_backend

    own = resources.get(target, {})
    custom = {**required_resources(target), **{str(k): float(v) for k, v in (own.get("resources") or {}).items()}}
    opts: dict[str, Any] = {"num_cpus": float(own.get("num_cpus", 1)), "max_retries": 0}
    gpus = own.get("num_gpus", get_backend(target).gpus)
    if gpus:
        opts["num_gpus"] = float(gpus)
    if custom:
        opts["resources"] = custom
    return opts


def local_source(job: Job, model: bytes, folder: Path) -> Job:
    """``job`` as this node runs it: the model file where the driver had it, when it is there with the
    same bytes (a shared file system), else the driver's bytes written into ``folder``."""
    path = source_file(job.source)
    if path.is_file() and digest_of([path], job.source) == job.digest:
        return job
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / path.name
    copy.write_bytes(model)
    head, _, fn = job.source.rpartition(":")
    return replace(job, source=f"{copy}:{fn}" if head.endswith(".py") else str(copy))


def run_remote(job_data: dict[str, Any], cache_dir: str | None, model: bytes) -> tuple[dict[str, Any], bytes]:
    """The task body, on the node that runs it: the job in a fresh process, its folder as a tar.gz."""
    from cuvil.verify.fleet.isolation import run_job

    with tempfile.TemporaryDirectory(prefix="cuvil-fleet-") as tmp:
        job = local_source(Job.from_json(job_data), model, Path(tmp) / "model")
        folder = Path(tmp) / job.key
        result = run_job(job, folder, cache_dir)
        result.node = platform.node()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(folder, arcname=".")
        return result.to_json(), buf.getvalue()


def unpack(archive: bytes, folder: Path) -> None:
    """A job folder sent back by a task, into the driver's results folder (nothing outside it)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(folder, filter="data")


class RayExecutor:
    """Runs jobs as Ray tasks, at most ``jobs`` in flight (default: the cluster's CPUs)."""

    name = "ray"

    def __init__(self, address: str | None, jobs: int | None, resources: Mapping[str, Mapping[str, Any]]) -> None:
        self.address = address
        self.jobs = jobs
        self.resources = resources
        self._ray = _ray()
        self._own = False  # this executor started the Ray connection (and a local cluster)
        self._limit = 1

    def start(self) -> int:
        """Connect (or start a local cluster, stopped by :meth:`stop`); returns the tasks kept in flight."""
        ray = self._ray
        if not ray.is_initialized():
            if self.address is None:
                ray.init(resources=node_resources(), include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
            self._own = True
        self._limit = self.jobs if self.jobs is not None else max(1, int(ray.cluster_resources().get("CPU", 1)))
        return self._limit

    def stop(self) -> None:
        if self._own:
            self._ray.shutdown()
            self._own = False

    def run(self, todo: Sequence[Job], store: ResultStore, cache_dir: str | None, sweep: Sweep) -> None:
        ray = self._ray
        task = ray.remote(run_remote)
        limit = self._limit
        models: dict[str, Any] = {}  # the model's bytes in the object store, once per model, for nodes without them
        for job in todo:
            if job.digest not in models:
                models[job.digest] = ray.put(source_file(job.source).read_bytes())
        queue = deque(todo)
        pending: dict[Any, Job] = {}
        try:
            while queue or pending:
                while queue and len(pending) < limit and not sweep.stopping:
                    job = queue.popleft()
                    ref = task.options(**task_options(job.target, self.resources)).remote(job.to_json(), cache_dir,
                                                                                       models[job.digest])
                    pending[ref] = job
                    sweep.started(job)
                if sweep.stopping and queue:
                    sweep.dropped(list(queue))
                    queue.clear()
                if not pending:
                    continue
                done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
                for ref in done:
                    job = pending.pop(ref)
                    try:
                        data, archive = ray.get(ref)
                    except ray.exceptions.RayError as exc:  # the task or its worker died: the job's error, not the sweep's
                        last = (str(exc).strip().splitlines() or [""])[-1][:300]
                        sweep.finished(failed_to_run(job, f"the Ray task failed: {type(exc).__name__}: {last}"))
                        continue
                    unpack(archive, store.job_dir(job.key))
                    sweep.finished(JobResult.from_json(data))
        except KeyboardInterrupt:
            for ref in pending:  # a cancel raises in the task, whose job process group is then killed
                ray.cancel(ref)
            deadline = time.monotonic() + 10
            while pending and time.monotonic() < deadline:
                done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
                for ref in done:
                    pending.pop(ref, None)
            raise


def main() -> None:
    """``python -m cuvil.verify.fleet.executor_ray``: the --resources JSON for ``ray start`` on this node."""
    import json

    print(json.dumps(node_resources()))


if __name__ == "__main__":
    main()

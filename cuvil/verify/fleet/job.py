"""One fleet job, in the process that runs this module: ``python -m cuvil.verify.fleet.job SPEC.json``.

``SPEC.json`` holds the job (cuvil/verify/fleet/jobs.py), the folder to write in and the build
cache.  The process first limits its own address space to the job's memory limit
(``RLIMIT_AS``, by default the machine's RAM: an allocation beyond it fails here, not on the
machine) and asks to die with
its parent, then runs the existing ``cuvil.verify`` on the model for the one target and check
group, with the job's planted faults, thresholds, samples and baseline, writes the full report to
``report/`` and ``outcome.json`` beside it, and exits with ``cuvil verify``'s status (0 pass, 1 a
check failed, 2 a usage or input error; 3 out of memory outside a check).  A crash of compiled code
kills only this process: the driver reads the signal (cuvil/verify/fleet/isolation.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import resource
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cuvil.verify.fleet.jobs import MEMORY_MARKS, Job

EXIT_MEMORY = 3


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the one that started it dies (a killed driver or Ray worker
    leaves no job running behind it)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return


def physical_memory() -> int | None:
    """This machine's RAM in bytes (None where it cannot be told)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def limit_memory(limit: int | None) -> None:
    """Cap this process's address space at ``limit`` bytes (None: at the machine's RAM, so that a
    runaway allocation fails in the job instead of swapping the node or waking its OOM killer)."""
    if limit is None:
        limit = physical_memory()
        if limit is None:
            return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def _error(result: Any) -> dict[str, Any]:
    """A crashed check's exception type, and ``MemoryError`` where an allocation failed under it (an
    error wrapping a MemoryError, as the reference interpreter's per-node errors do, says so)."""
    error = result.details.get("error")
    if not isinstance(error, dict):
        return {}
    kind = str(error.get("type", ""))
    if any(mark in f"{kind}: {error.get('message', '')}" for mark in MEMORY_MARKS):
        kind = "MemoryError"
    return {"error": kind}


def _results(report: Any) -> list[dict[str, Any]]:
    return [{"check": r.check, "target": r.target, "status": str(r.status), "summary": r.summary, **_error(r)}
            for r in report.results]


def run(job: Job, out: Path, cache_dir: str | None) -> dict[str, Any]:
    """Verify the job's model and return the outcome (what ``outcome.json`` holds)."""
    from cuvil.faults import plant
    from cuvil.verify import verify
    from cuvil.verify.config import VerifyConfig, load_config, with_options
    from cuvil.verify.report import to_jsonable
    from cuvil.verify.runner import Progress

    s = job.settings
    cfg = load_config(s["config"]) if s.get("config") else VerifyConfig()  # never a cuvil.toml found by chance
    cfg = with_options(cfg, s.get("thresholds") or {})
    if s.get("seed") is not None:
        cfg = replace(cfg, seed=int(s["seed"]))
    with plant(*s.get("faults") or ()):
        report = verify(job.source, targets=[job.target], checks=[job.checks], config=cfg,
                        report_dir=out / "report", strict=True if s.get("strict") else None,
                        baseline=s.get("baseline"), inputs=s.get("inputs"), cache_dir=cache_dir,
                        progress=Progress(sys.stderr, tty=False))
    figures = {f"{r.check}.{k}" if r.target in (None, job.target) else f"{r.check}[{r.target}].{k}": v
               for r in report.results for k, v in r.figures.items()}
    results = _results(report)
    outcome: dict[str, Any] = to_jsonable({"exit_status": report.exit_status, "verdict": report.verdict, "counts": report.counts(),
                        "results": results, "figures": figures,
                        "memory": any(r.get("error") == "MemoryError" for r in results)})
    return outcome


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m cuvil.verify.fleet.job SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    job = Job.from_json(spec["job"])
    out = Path(spec["out"])
    _die_with_parent()
    limit_memory(job.memory)
    faulthandler.enable()  # a crash in compiled code leaves the Python stack that called it in the log
    from cuvil.errors import CuvilError

    try:
        outcome = run(job, out, spec.get("cache_dir"))
        code = int(outcome["exit_status"])
    except MemoryError:
        outcome, code = {"exit_status": EXIT_MEMORY, "memory": True,
                         "error": "MemoryError: the job ran out of its memory limit"}, EXIT_MEMORY
    except CuvilError as exc:  # a usage or input error (VerifyError among them): exit status 2, as cuvil verify
        outcome, code = {"exit_status": 2, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}, 2
    tmp = out / f".outcome.{os.getpid()}.json"
    tmp.write_text(json.dumps(outcome, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / "outcome.json")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fleet's unit of work: one (model, target, check group) job, its content-addressed key, its
result, and the results folder that keeps results under their keys.

A job's key is the SHA-256 of everything that decides its outcome: the model's digest (the bytes of
its file, or of the Python file of a ``file.py:factory``), Cuvil's version, the settings (planted
faults, seed, strictness, thresholds, and the bytes of the configuration, input samples and
baseline files it reads), its limits, the target and the check group.  A result is stored as
``jobs/KEY/result.json`` in the results folder, beside the job's full ``cuvil verify`` report
(``jobs/KEY/report/``) and its log: ``--resume`` takes the stored result of every job whose key has
one, so a model whose bytes did not change is not verified again when another one did.

Job statuses: ``pass`` (every check passed), ``fail`` (a check failed), ``error`` (a usage or input
error: the model cannot be read, a bad configuration), ``crash`` (the process died of a signal),
``timeout`` (killed after its time limit), ``memory`` (it ran out of its memory limit).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil._version import __version__
from cuvil.verify.fleet.spec import Fleet, ModelEntry

STATUSES = ("pass", "fail", "error", "crash", "timeout", "memory")
#: The statuses of a job that did not finish its checks: the job's own failure, not a check's verdict.
ABNORMAL = frozenset({"error", "crash", "timeout", "memory"})
KEY_LENGTH = 24
#: What an allocation that failed under the memory limit (RLIMIT_AS) reads like: Python's MemoryError,
#: C++'s and the C library's messages (wasmtime's reservation of a module's memory among them).
MEMORY_MARKS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "out of memory",
                "Memory allocation failed", "failed to allocate")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_digest(path: Path) -> str:
    """The digest of a file, or of a folder's files (their relative names and bytes)."""
    if path.is_file():
        return file_digest(path)
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file()):
        h.update(p.relative_to(path).as_posix().encode() + b"\0" + file_digest(p).encode())
    return h.hexdigest()


def model_digest(entry: ModelEntry) -> str:
    """The digest of a model's bytes (a factory's Python file, and its function's name)."""
    return digest_of(entry.files, entry.source)


def digest_of(files: Sequence[Path], source: str) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(file_digest(f).encode())
    head, _, fn = source.rpartition(":")
    if head.endswith(".py"):
        h.update(b"factory:" + fn.encode())
    return h.hexdigest()


def source_file(source: str) -> Path:
    """The file a model source names: the ONNX file, or a factory's Python file."""
    head, _, _ = source.rpartition(":")
    return Path(head) if head.endswith(".py") else Path(source)


@dataclass(frozen=True)
class Job:
    """One (model, target, check group) to verify in a process of its own."""

    model: str
    source: str
    target: str
    checks: str
    key: str
    digest: str
    timeout: float
    memory: int | None
    #: What the job process passes to cuvil.verify (JSON data: paths as strings).
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Job:
        return Job(str(d["model"]), str(d["source"]), str(d["target"]), str(d["checks"]), str(d["key"]),
                   str(d["digest"]), float(d["timeout"]), None if d.get("memory") is None else int(d["memory"]),
                   dict(d.get("settings") or {}))

    @property
    def label(self) -> str:
        return f"{self.model} [{self.target}] {self.checks}"


def _settings(entry: ModelEntry) -> dict[str, Any]:
    return {"faults": list(entry.faults), "seed": entry.seed, "strict": entry.strict,
            "thresholds": {k: dict(v) for k, v in entry.thresholds.items()},
            "config": None if entry.config is None else str(entry.config),
            "inputs": None if entry.inputs is None else str(entry.inputs),
            "baseline": None if entry.baseline is None else str(entry.baseline)}


def job_key(digest: str, target: str, checks: str, settings: Mapping[str, Any], timeout: float,
            memory: int | None) -> str:
    """The content hash naming a job's result (what decides its outcome; not where the files lie)."""
    files = {k: tree_digest(Path(settings[k])) for k in ("config", "inputs", "baseline") if settings.get(k)}
    what = {"model": digest, "cuvil": __version__, "target": target, "checks": checks,
            "settings": {k: v for k, v in settings.items() if k not in files}, "files": files,
            "limits": {"timeout": timeout, "memory": memory}}
    text = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_LENGTH]


def plan_jobs(fleet: Fleet) -> list[Job]:
    """Every job of the fleet, model by model, in the order the file lists them."""
    jobs: list[Job] = []
    for entry in fleet.models:
        digest = model_digest(entry)
        settings = _settings(entry)
        for target in entry.targets:
            for checks in entry.checks:
                key = job_key(digest, target, checks, settings, entry.timeout, entry.memory)
                jobs.append(Job(entry.name, entry.source, target, checks, key, digest, entry.timeout, entry.memory,
                                settings))
    return jobs


@dataclass
class JobResult:
    """What one job came to: its status, the signature of an abnormal end, and the report's figures."""

    key: str
    model: str
    target: str
    checks: str
    status: str
    summary: str
    seconds: float
    signature: str | None = None  # "SIGSEGV", "timeout after 4 s", "MemoryError" ...
    exit_code: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    #: Per check result: check, target, status and summary (the report holds the rest).
    results: list[dict[str, Any]] = field(default_factory=list)
    #: The report's figures, "check.figure" -> value (for the dashboard's drift and trends).
    figures: dict[str, float] = field(default_factory=dict)
    drift: float | None = None
    node: str = ""
    log_tail: str = ""
    resumed: bool = False  # taken from the results folder, not run in this sweep

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("resumed")
        return d

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> JobResult:
        known = {k: d[k] for k in JobResult.__dataclass_fields__ if k in d and k != "resumed"}
        return JobResult(**known)


def drift_of(figures: Mapping[str, float]) -> float | None:
    """How far the job's outputs moved from their reference: the largest drift or relative-L2 figure
    (not the model's own float32 floor, nor a bound)."""
    values = [v for k, v in figures.items()
              if ("drift" in k.rsplit(".", 1)[-1] or k.endswith("rel_l2")) and "floor" not in k
              and isinstance(v, (int, float)) and v == v]
    return max(values, default=None)


class ResultStore:
    """The results folder: ``jobs/KEY/`` per job (result.json, report/, log.txt)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def job_dir(self, key: str) -> Path:
        return self.root / "jobs" / key

    def report_link(self, key: str) -> str:
        """The job's cuvil verify report, relative to the results folder."""
        return f"jobs/{key}/report/report.html"

    def load(self, key: str) -> JobResult | None:
        """The stored result of job ``key``, or None (none stored, or unreadable: the job runs again)."""
        p = self.job_dir(key) / "result.json"
        try:
            return JobResult.from_json(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def save(self, result: JobResult) -> Path:
        """Store ``result`` (written beside, then renamed: a sweep killed mid-write leaves no half file)."""
        folder = self.job_dir(result.key)
        folder.mkdir(parents=True, exist_ok=True)
        p = folder / "result.json"
        tmp = folder / f".result.{os.getpid()}.json"
        tmp.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, p)
        return p

    def stored(self) -> Iterator[JobResult]:
        for p in sorted((self.root / "jobs").glob("*/result.json")):
            r = self.load(p.parent.name)
            if r is not None:
                yield r

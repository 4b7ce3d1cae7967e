"""The Report: every result of one verification run, its counts and its verdict.

The verdict is the exit status of ``cuvil verify``: 0 when nothing failed, 1 when a check
failed (or crashed), and, with ``strict``, when a check warned. Skips never fail. Status 2
(a usage or input error) is decided before a report exists: see :class:`VerifyError`.

A check that crashed is a failed result whose ``details["error"]`` holds the exception's type,
message and traceback; reports render it as an error rather than a failure.
"""

from __future__ import annotations

import datetime
import math
import platform
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from cuvil._version import __version__
from cuvil.verify.base import CheckResult, Status

FORMAT = "cuvil-verify-report"
FORMAT_VERSION = 1
STATUS_ORDER = (Status.FAIL, Status.WARN, Status.PASS, Status.SKIP)


def is_error(result: CheckResult) -> bool:
    """Whether a result records a crash of its check (not a verdict on the model)."""
    return result.status is Status.FAIL and isinstance(result.details.get("error"), dict)


@dataclass
class Report:
    """The results of one run, in the order they were produced."""

    model: str
    targets: list[str]
    checks: list[str]
    results: list[CheckResult] = field(default_factory=list)
    strict: bool = False
    subject: str = "cuvil"
    started: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    seconds: float = 0.0
    environment: dict[str, str] = field(default_factory=dict)
    config_path: str | None = None
    #: Where the time went, per check in run order: wall seconds, and the shared builds it made first
    #: (target, options, seconds; a later check reusing a build pays nothing).
    timings: list[dict[str, Any]] = field(default_factory=list)
    #: Per model input, what its samples were drawn from: ``name``, ``source`` (where that came
    #: from: declared, an example, inferred from the graph, the default) and ``domain`` (in words).
    inputs: list[dict[str, str]] = field(default_factory=list)
    #: Per symbolic dim of the inputs, the extents its samples use: ``symbol``, ``smallest`` (the
    #: smallest valid extent, derived from the graph over the declared constraint), ``sample`` (the
    #: extent generated samples use) and ``why`` (in words: what set the smallest, where the typical came from).
    dims: list[dict[str, Any]] = field(default_factory=list)
    #: Warnings about the run as a whole (not about one check): every input generated, for instance.
    warnings: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[CheckResult]:
        return iter(self.results)

    def counts(self) -> dict[str, int]:
        """Results per status, every status present (``{"pass": 3, "fail": 0, "warn": 1, "skip": 0}``)."""
        out = {str(s): 0 for s in Status}
        for r in self.results:
            out[str(r.status)] += 1
        return out

    def by_status(self, status: Status) -> list[CheckResult]:
        return [r for r in self.results if r.status is status]

    def get(self, check: str, target: str | None = None) -> list[CheckResult]:
        """The results of ``check`` (on ``target`` when it is given)."""
        return [r for r in self.results if r.check == check and (target is None or r.target == target)]

    @property
    def failed(self) -> list[CheckResult]:
        """The results that make the run fail: failures, and warnings when strict."""
        bad = {Status.FAIL, Status.WARN} if self.strict else {Status.FAIL}
        return [r for r in self.results if r.status in bad]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_status(self) -> int:
        return 0 if self.ok else 1

    @property
    def verdict(self) -> str:
        """One line: "PASS: 12 pass, 1 warn, 0 fail, 2 skip" or "FAIL: ..."."""
        c = self.counts()
        return f"{'PASS' if self.ok else 'FAIL'}: " + ", ".join(f"{c[str(s)]} {s}" for s in
                                                               (Status.PASS, Status.WARN, Status.FAIL, Status.SKIP))

    def to_json(self) -> dict[str, Any]:
        """The whole report as JSON-ready data (tensors are listed by name, not included)."""
        data: dict[str, Any] = to_jsonable({
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "model": self.model,
            "subject": self.subject,
            "targets": list(self.targets),
            "checks": list(self.checks),
            "strict": self.strict,
            "started": self.started,
            "seconds": self.seconds,
            "environment": dict(self.environment),
            "config": self.config_path,
            "counts": self.counts(),
            "exit_status": self.exit_status,
            "results": [r.to_json() for r in self.results],
            "timings": list(self.timings),
            "inputs": list(self.inputs),
            "dims": list(self.dims),
            "warnings": list(self.warnings),
        })
        return data


def environment() -> dict[str, str]:
    """Where the run happened, for the report header."""
    return {
        "cuvil": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "hostname": platform.node(),
    }


def to_jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data: numpy scalars and arrays as numbers and lists, paths and enums as
    strings, tuples and sets as lists, and non-finite floats as the strings "NaN", "Infinity" and
    "-Infinity" (JSON has no such numbers; :func:`from_json_number` reads them back)."""
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "Infinity" if f > 0 else "-Infinity"
        return f
    if isinstance(obj, np.bool_):
        return bool(obj)
    if isinstance(obj, Enum):
        return to_jsonable(obj.value)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((to_jsonable(v) for v in obj), key=repr)
    if hasattr(obj, "to_json"):
        return to_jsonable(obj.to_json())
    return repr(obj)


def from_json_number(value: Any) -> float | None:
    """A figure read back from JSON (None when it is not a number)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    return None

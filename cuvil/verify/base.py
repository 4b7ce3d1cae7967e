"""What a verification check is, and what it returns: results are data.

A check is a small named object with a ``run(ctx)`` method that returns
:class:`CheckResult` objects (one per target it looks at, or one overall).
Each result has a status (pass / fail / warn / skip), figures (numbers a
baseline can compare), details (free-form data for the report), ``where``
(the op, node, pass, layer or symbol it points at) and optional tensors
(saved beside the JSON report as ``.npz``, never inside it).

    @register_check
    class Coverage(Check):
        '''Every source op maps to Cuvil ops with a kernel on each target.'''

        name = "coverage"
        group = "compatibility"

        def run(self, ctx: VerifyContext) -> list[CheckResult]:
            ...

Checks never print; the runner reports progress and renders results.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from cuvil.errors import CuvilError


class VerifyError(CuvilError):
    """A usage or input error of the verification suite (exit status 2)."""


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    WARN = "warn"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


@dataclass
class CheckResult:
    """One check's verdict on one target (``target`` is None when it is target-independent)."""

    check: str
    status: Status
    summary: str
    target: str | None = None
    figures: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "target": self.target,
            "status": str(self.status),
            "summary": self.summary,
            "figures": dict(self.figures),
            "details": self.details,
            "where": dict(self.where),
            "tensors": sorted(self.tensors),
            "seconds": self.seconds,
        }


class Check:
    """Base of all checks; subclasses set ``name`` and ``group`` and implement ``run``."""

    name: ClassVar[str] = ""
    group: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})

    def option(self, key: str, default: Any) -> Any:
        return self.options.get(key, default)

    def settings(self, ctx: Any, defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """This check's settings for ``ctx``: ``defaults``, overridden by the configuration's
        ``[checks.NAME]`` table, overridden by the options this check was made with."""
        return {**(defaults or {}), **ctx.check_config(self.name), **self.options}

    def run(self, ctx: Any) -> list[CheckResult]:
        raise NotImplementedError


_CHECKS: dict[str, type[Check]] = {}


def register_check(cls: type[Check]) -> type[Check]:
    if not cls.name or not cls.group:
        raise ValueError(f"{cls.__name__} needs a name and a group")
    _CHECKS[cls.name] = cls
    return cls


def get_check(name: str) -> type[Check]:
    try:
        return _CHECKS[name]
    except KeyError:
        known = ", ".join(sorted(_CHECKS))
        raise VerifyError(f"unknown check {name!r} (known: {known})") from None


def all_checks() -> dict[str, type[Check]]:
    return dict(_CHECKS)

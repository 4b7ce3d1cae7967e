"""Run limits: bounds on what one call may do, for models whose loops the caller does not trust.

A ``Loop`` runs as long as its trip count and condition say, and its scan
outputs grow with every iteration; a model can ask for 2^31 iterations. Both
limits are off by default (a model runs as ONNX defines it) and are given per
call: ``CompiledModel.run(inputs, max_loop_iterations=N, max_output_bytes=B)``
or ``cuvil run --max-loop-iterations N --max-output-bytes B``.

- ``max_loop_iterations``: no loop runs more than this many iterations (a
  nested loop counts its own);
- ``max_output_bytes``: no value a loop builds (a carried value, or a scan
  output stacked over the iterations) grows beyond this many bytes.

A call that would pass a limit fails with an error naming the loop.  The
limits travel in a context variable, read by the executors that enforce them
(the reference interpreter, the C targets).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from cuvil.errors import CuvilError


class RunLimitError(CuvilError):
    """A call passed one of its run limits."""


@dataclass(frozen=True)
class RunLimits:
    """Per-call limits; None: no limit."""

    max_loop_iterations: int | None = None
    max_output_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_loop_iterations", "max_output_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 1 << 63):
                raise CuvilError(f"{name} must be a positive integer or None, not {v!r}")

    @property
    def any(self) -> bool:
        return self.max_loop_iterations is not None or self.max_output_bytes is not None


NONE = RunLimits()
_CURRENT: ContextVar[RunLimits] = ContextVar("cuvil_run_limits", default=NONE)


def current() -> RunLimits:
    """The limits of the call running in this context."""
    return _CURRENT.get()


@contextlib.contextmanager
def applied(limits: RunLimits) -> Iterator[None]:
    """Run the calls inside under ``limits``."""
    token = _CURRENT.set(limits)
    try:
        yield
    finally:
        _CURRENT.reset(token)

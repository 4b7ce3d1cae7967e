"""Planted faults: known bugs a test switches on to prove that a verification check catches them.

The verification suite is only as good as the bugs it is shown to catch.  Each fault below is a
realistic compiler bug (a wrong stride, an arena overlap, a dropped guard...) planted at the one
place in the compiler where such a bug would live; the code there asks ``faults.active(name)``.
Nothing is ever active unless a caller plants it::

    with cuvil.faults.plant("bn-epsilon"):
        m = cuvil.compile(model, "native", cache_dir=tmp)
    report = cuvil.verify(...)   # the `passes` check must point at fold-batchnorm

A planted fault always changes the generated code or the graph, so a build made with one never
shares a build-cache entry with a correct build.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cuvil.errors import CuvilError

#: Every fault that can be planted, with the bug it reproduces and the check meant to catch it.
FAULTS: dict[str, str] = {
    "conv-stride": "a convolution kernel steps its input with the wrong stride (check: layerwise)",
    "conv-pad": "a convolution kernel's padding is off by one (check: layerwise)",
    "bn-epsilon": "BatchNorm folding uses a wrong epsilon (check: passes)",
    "arena-overlap": "the memory planner places two live values in overlapping arena regions (check: fusion-memory)",
    "stale-read": "a kernel reads an arena region before it is written (check: fusion-memory)",
    "shared-scratch": "a kernel keeps its scratch buffer in static storage shared by instances (check: concurrency)",
    "if-branch": "an If node runs the wrong branch for one condition (check: control-flow)",
    "drop-guard": "a symbolic dim's upper-bound guard is not emitted (check: dynamic-shapes)",
}

_lock = threading.Lock()
_active: set[str] = set()


def active(name: str) -> bool:
    """Whether fault ``name`` is planted now (the compiler asks this at the fault's one place)."""
    if name not in FAULTS:
        raise CuvilError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return name in _active


@contextmanager
def plant(*names: str) -> Iterator[None]:
    """Plant the named faults for the duration of the ``with`` block."""
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise CuvilError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    with _lock:
        added = [n for n in names if n not in _active]
        _active.update(added)
    try:
        yield
    finally:
        with _lock:
            _active.difference_update(added)

"""Planted faults: known bugs a test switches on to prove that a verification check catches them.

The verification suite is only as good as the bugs it is shown to catch.  Each fault below is a
realistic compiler bug (a wrong stride, an arena overlap, a dropped guard...) planted at the one
place in the compiler where such a bug would live.  The faults a compile plants are a field of its
options (``CompileOptions.faults``), passed down to the passes and the code generator like every
other option: the place of a fault asks ``faults.active(name, planted)`` of the set it was given,
never a process-wide flag.  Nothing is ever planted unless a caller asks::

    m = cuvil.compile(model, "native", cache_dir=tmp, faults={"bn-epsilon"})

or, for a whole block (a verification run compiles many builds), :func:`plant`, which makes the
named faults the default of every ``CompileOptions`` made inside the block (a context variable:
the block's thread, and the threads started with a copy of its context, see
``contextvars.copy_context``)::

    with cuvil.faults.plant("bn-epsilon"):
        report = cuvil.verify(...)   # the `passes` check must point at fold-batchnorm

A planted fault always changes the generated code or the graph, and the planted set is part of the
build-cache key, so a build made with one never shares a build-cache entry with a correct build.
"""

from __future__ import annotations

import contextvars
from collections.abc import Collection, Iterable, Iterator
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
    "native-crash": "a C build's call reads through a null pointer: the process dies of SIGSEGV "
                    "(caught by: the job isolation of cuvil verify-fleet)",
    "native-hang": "a C build's call never returns (caught by: the job time limit of cuvil verify-fleet)",
}
#: The faults planted in the call path of a C build (cuvil/runtime/compiled.py) rather than in the
#: generated code: what they do to the process is the bug (:func:`trip`).
CALL_FAULTS = ("native-crash", "native-hang")

# The faults :func:`plant` asks for in this context: the default of ``CompileOptions.faults``.
_planted: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("cuvil_planted_faults",
                                                                          default=frozenset())


def checked(names: Iterable[str]) -> frozenset[str]:
    """``names`` as a set, each one a known fault (a :class:`CuvilError` names the unknown ones)."""
    if isinstance(names, str):
        names = (names,)
    out = frozenset(names)
    unknown = sorted(n for n in out if n not in FAULTS)
    if unknown:
        raise CuvilError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    return out


def active(name: str, planted: Collection[str]) -> bool:
    """Whether fault ``name`` is among ``planted`` (the faults of the compile being made): the
    compiler asks this at the fault's one place."""
    if name not in FAULTS:
        raise CuvilError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
    return name in planted


def call_fault(planted: Collection[str]) -> str | None:
    """The call-path fault among ``planted`` (:data:`CALL_FAULTS`; the first when both are), or None."""
    return next((name for name in CALL_FAULTS if name in planted), None)


def trip(name: str) -> None:
    """What a call of a model built with call-path fault ``name`` does instead of running: a read
    through a null pointer in native code (``native-crash``: SIGSEGV, as a wild pointer in a kernel
    would), or a wait that never ends (``native-hang``: as a kernel's loop whose bound never comes)."""
    if name == "native-crash":
        import ctypes

        ctypes.string_at(0)  # SIGSEGV: the process ends here
    elif name == "native-hang":
        import time

        while True:
            time.sleep(3600)
    raise CuvilError(f"{name!r} is not a call-path fault (those are: {', '.join(CALL_FAULTS)})")


def planted() -> frozenset[str]:
    """The faults :func:`plant` plants in the current context (what ``CompileOptions`` defaults to)."""
    return _planted.get()


@contextmanager
def plant(*names: str) -> Iterator[None]:
    """Plant the named faults in every compile whose options are made inside the ``with`` block."""
    added = checked(names)
    token = _planted.set(_planted.get() | added)
    try:
        yield
    finally:
        _planted.reset(token)


# ---- the CUDA kernels' faults -----------------------------------------------------------------------------
# Planted in the CUDA code generator (cuvil/backends/cuda) and caught by the emulated tests under the
# execution harness (tests/cuda/test_cuda_faults.py: cuda-sim against the reference), not by a verify check.
CUDA_FAULTS: dict[str, str] = {
    "cuda-matmul-no-sync": "the tiled matmul loads its next tiles without a barrier after the last use of the "
                           "previous ones (check: tests/cuda, cuda-sim against ref)",
    "cuda-matmul-tile-bound": "the tiled matmul's bound on the inner dim is off by one, reading one element past "
                              "each row (check: tests/cuda, cuda-sim against ref)",
    "cuda-shuffle-lane": "the warp reduction's last butterfly step reads the wrong lane (check: tests/cuda, "
                         "cuda-sim against ref)",
}
FAULTS.update(CUDA_FAULTS)

"""Loading a compiled model library with ctypes and calling it, and how many threads it runs.

ctypes releases the GIL for the duration of each foreign call, so calls
from several Python threads run in parallel; each call owns its memory.
Inside a call, the model's kernels split their work over ``num_threads``
threads (``cuvil_set_num_threads``; the default is the physical cores this
process may use).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import math
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.limits import RunLimits
from cuvil.limits import current as current_limits

MAX_RANK = 8


@dataclass(frozen=True)
class ThreadStats:
    """What a model's worker threads did since they started (all zero for one thread).

    A region is a kernel's work split into tasks for the threads; the cost model runs a region on
    the calling thread alone (``declined_regions``) when splitting would not pay: too little work,
    or workers that were recently slow to join (cores busy with other work).  A low
    ``worker_share`` with regions run means the workers hardly got a core while the caller ran
    the tasks."""

    COUNT: ClassVar[int] = 7  # numbers cuvil_get_thread_stats reports

    calls: int  # calls that had the worker threads (a call made while another had them runs alone)
    regions: int  # regions run on the threads
    declined_regions: int  # regions run on the calling thread alone
    tasks: int  # tasks of the regions run on the threads
    worker_tasks: int  # of those, the tasks workers ran (the caller ran the rest)
    wait_s: float  # time callers waited for workers at the ends of regions
    wait_estimate_s: float  # the cost model's current estimate of that wait, per region

    @property
    def worker_share(self) -> float | None:
        """The fraction of the threaded regions' tasks that workers ran (None before any region)."""
        return self.worker_tasks / self.tasks if self.tasks else None

    def since(self, before: ThreadStats) -> ThreadStats:
        """The counts between ``before`` and this (the estimate is this one's)."""
        return ThreadStats(self.calls - before.calls, self.regions - before.regions,
                           self.declined_regions - before.declined_regions, self.tasks - before.tasks,
                           self.worker_tasks - before.worker_tasks, self.wait_s - before.wait_s,
                           self.wait_estimate_s)
_CODE_TO_DTYPE = {ct.code(d): d for d in DType}
# Per call, the marshalling below looks types up in these instead of going through DType.
_CODE_TO_NP = {c: d.np for c, d in _CODE_TO_DTYPE.items() if d.np is not None}
_NP_TO_CODE = {d.np: c for c, d in _CODE_TO_DTYPE.items() if d.np is not None}
_log = logging.getLogger(__name__)
# An output up to this size is copied into an array NumPy owns and its C buffer freed at once;
# a larger one is shared (zero-copy) and freed with its array.  Below it, the copy costs less
# than tying the buffer's life to the array (a finalizer per output).
COPY_OUTPUT_BYTES = 64 * 1024


@functools.cache
def physical_cores() -> int:
    """The physical cores among the CPUs this process may run on (hyperthread siblings count once).

    Read from Linux's CPU topology; where that is not available, the logical CPUs are counted."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as pkg, open(f"{topo}/core_id") as core:
                cores.add((pkg.read().strip(), core.read().strip()))
        except OSError:
            return max(len(cpus), 1)
    return max(len(cores), 1)


def check_num_threads(num_threads: int | None) -> int:
    """``num_threads`` as given, or the default (:func:`physical_cores`) for None."""
    if num_threads is None:
        return physical_cores()
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise CuvilError(f"num_threads must be a positive integer or None, not {num_threads!r}")
    return num_threads


# What every model library exports, whichever Cuvil built it (cuvil_api.h).
_REQUIRED = ("cuvil_load", "cuvil_unload", "cuvil_run", "cuvil_free", "cuvil_num_inputs", "cuvil_num_outputs")

# cuvil_set_split_policy's policies (cuvil_threads.h: CUVIL_SPLIT_AUTO, CUVIL_SPLIT_ALWAYS)
SPLIT_POLICIES: dict[str, int] = {"auto": 0, "always": 1}


class RunError(CuvilError):
    """The compiled model reported an error while running."""


def _address(a: np.ndarray) -> int:
    """The address of a C-contiguous array's first element.  Through the buffer protocol when the
    array is writable (a fifth of the time ``a.ctypes.data`` takes); else, or when it is empty,
    through ``a.ctypes``."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a.data))
    except (TypeError, ValueError, BufferError):
        return int(a.ctypes.data)


@dataclass(frozen=True)
class LibrarySignature:
    """What a library says about itself (``cuvil_signature``): its target, and each input's and
    output's element type and rank."""

    target: str
    inputs: tuple[tuple[str, int], ...]
    outputs: tuple[tuple[str, int], ...]


def _signature(lib: ctypes.CDLL) -> LibrarySignature | None:
    """The library's ``cuvil_signature()``, or None for a library built without it (by an older Cuvil)."""
    fn = getattr(lib, "cuvil_signature", None)
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    try:
        d = json.loads(fn() or b"")
        return LibrarySignature(str(d["target"]), *(tuple((str(t), int(r)) for t, r in d[k])
                                                     for k in ("inputs", "outputs")))
    except (ValueError, TypeError, KeyError) as exc:
        raise CuvilError(f"the library's cuvil_signature() is malformed ({exc})") from None


class CTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("rank", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class NativeModel:
    """A loaded model library and its weights, running ``num_threads`` threads per call (None: the default)."""

    def __init__(self, library: Path, weights: Path | None, num_threads: int | None = None) -> None:
        self.path = library
        self.lib = ctypes.CDLL(str(library))
        lib = self.lib
        missing = [f for f in _REQUIRED if not hasattr(lib, f)]
        if missing:
            raise CuvilError(f"{library.name} is not a Cuvil model library: it lacks {', '.join(missing)}")
        lib.cuvil_load.restype = ctypes.c_void_p
        lib.cuvil_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.cuvil_unload.argtypes = [ctypes.c_void_p]
        lib.cuvil_unload.restype = None
        lib.cuvil_run.restype = ctypes.c_int
        lib.cuvil_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.POINTER(CTensor), ctypes.c_char_p,
                                  ctypes.c_size_t]
        lib.cuvil_free.argtypes = [ctypes.c_void_p]
        lib.cuvil_free.restype = None
        lib.cuvil_num_inputs.restype = ctypes.c_int
        lib.cuvil_num_outputs.restype = ctypes.c_int
        self.n_inputs = int(lib.cuvil_num_inputs())
        self.n_outputs = int(lib.cuvil_num_outputs())
        self.signature = _signature(lib)
        err = ctypes.create_string_buffer(1024)
        handle = lib.cuvil_load(str(weights).encode() if weights else None, err, len(err))
        if not handle:
            raise CuvilError(f"cannot load {library.name}: {err.value.decode(errors='replace')}")
        self._handle: ctypes.c_void_p | None = ctypes.c_void_p(handle)
        self._local = threading.local()
        self.num_threads = 1
        self.set_num_threads(check_num_threads(num_threads))

    def set_num_threads(self, n: int) -> None:
        """Split each call's kernels over ``n`` threads (1: no worker threads); not while calls run."""
        n = check_num_threads(n)
        if self._handle is None:
            raise CuvilError("the model was closed")
        fn = getattr(self.lib, "cuvil_set_num_threads", None)
        if fn is None:  # a library built before threading (a saved artifact): it can only run one thread
            if n > 1:
                _log.warning("%s has no cuvil_set_num_threads (built by an older Cuvil): it runs single-threaded",
                             self.path)
            return
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        err = ctypes.create_string_buffer(1024)
        if fn(self._handle, n, err, len(err)) != 0:
            raise CuvilError(f"cannot run {n} threads: {err.value.decode(errors='replace')}")
        self.num_threads = n

    def set_split_policy(self, policy: str) -> None:
        """How calls split their kernels' work over the threads (``cuvil_set_split_policy``): "auto"
        (the default) lets the cost model decline regions too small, or while workers are slow to
        answer; "always" splits every region that can be split, so which regions thread does not
        depend on timing or machine load (for tests).  Not while calls run."""
        code = SPLIT_POLICIES.get(policy)
        if code is None:
            raise CuvilError(f"split policy must be one of {', '.join(SPLIT_POLICIES)}, not {policy!r}")
        if self._handle is None:
            raise CuvilError("the model was closed")
        fn = getattr(self.lib, "cuvil_set_split_policy", None)
        if fn is None:
            raise CuvilError(f"{self.path} has no cuvil_set_split_policy (built by an older Cuvil)")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
        if fn(self._handle, code) != 0:
            raise CuvilError(f"cannot set the split policy {policy!r}")

    def split_policy(self) -> str | None:
        """The split policy now in force, or None for a library built without one."""
        if self._handle is None:
            raise CuvilError("the model was closed")
        fn = getattr(self.lib, "cuvil_get_split_policy", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p]
        code = int(fn(self._handle))
        return next((name for name, c in SPLIT_POLICIES.items() if c == code), None)

    def _buffers(self, n_in: int) -> tuple[ctypes.Array[CTensor], ctypes.Array[CTensor], ctypes.Array[ctypes.c_char],
                                          list[Any]]:
        """This thread's input and output descriptors, error buffer, and the (shape, dtype) each
        input descriptor holds now (made once per thread: calls on other threads have their own)."""
        local = self._local
        bufs = getattr(local, "bufs", None)
        if bufs is None or len(bufs[0]) < n_in:
            n = max(n_in, 1)
            bufs = ((CTensor * n)(), (CTensor * max(self.n_outputs, 1))(), ctypes.create_string_buffer(1024), [None] * n)
            local.bufs = bufs
        return bufs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != self.n_inputs:  # the library reads cuvil_num_inputs() descriptors, whatever it is given
            raise RunError(f"{self.path.name} takes {self.n_inputs} inputs, given {len(inputs)}")
        arrays = [np.asarray(a, order="C") for a in inputs]  # (ascontiguousarray makes 0-D arrays 1-D)
        ins, outs, err, held = self._buffers(len(arrays))
        for k, a in enumerate(arrays):
            t = ins[k]
            t.data = _address(a)
            key = (a.shape, a.dtype)
            if held[k] != key:  # a serving loop's calls repeat the shapes: only the address changes
                t.rank = a.ndim
                code = _NP_TO_CODE.get(a.dtype)
                t.dtype = code if code is not None else ct.code(DType.from_np(a.dtype))
                for i, d in enumerate(a.shape):
                    t.shape[i] = d
                held[k] = key
        if self._handle is None:
            raise CuvilError("the model was closed")
        limits = current_limits()
        if limits.any:
            rc = self._run_limited(limits, ins, outs, err)
        else:
            rc = self.lib.cuvil_run(self._handle, ins, outs, err, len(err))
        if rc != 0:
            raise RunError(err.value.decode("utf-8", errors="replace"))
        results = []
        free = self.lib.cuvil_free
        for t in outs[: self.n_outputs]:
            dt = _CODE_TO_NP[t.dtype]
            shape = tuple(t.shape[: t.rank])
            nbytes = math.prod(shape) * dt.itemsize
            if nbytes <= COPY_OUTPUT_BYTES:
                if nbytes:
                    arr = np.frombuffer((ctypes.c_char * nbytes).from_address(t.data), dt).copy().reshape(shape)
                else:
                    arr = np.empty(shape, dt)
                free(t.data)
                results.append(arr)
                continue
            # zero-copy: the array views the buffer the model allocated, freed with the array
            buf = (ctypes.c_char * nbytes).from_address(t.data)
            arr = np.frombuffer(memoryview(buf), dtype=dt).reshape(shape)
            weakref.finalize(arr.base if arr.base is not None else arr, free, t.data)
            results.append(arr)
        del arrays
        return results

    def _run_limited(self, limits: RunLimits, ins: Any, outs: Any, err: Any) -> int:
        """cuvil_run under ``limits``, which the library keeps per thread for the calls between."""
        fn = getattr(self.lib, "cuvil_set_run_limits", None)
        if fn is None:
            raise CuvilError(f"{self.path.name} has no cuvil_set_run_limits (built by an older Cuvil): it cannot "
                             "enforce max_loop_iterations or max_output_bytes")
        fn.restype = None
        fn.argtypes = [ctypes.c_int64, ctypes.c_int64]
        fn(limits.max_loop_iterations or 0, limits.max_output_bytes or 0)
        try:
            return int(self.lib.cuvil_run(self._handle, ins, outs, err, len(err)))
        finally:
            fn(0, 0)

    def thread_stats(self) -> ThreadStats | None:
        """What the model's worker threads did since they started (``cuvil_get_thread_stats``), or None
        for a library built without that function."""
        if self._handle is None:
            raise CuvilError("the model was closed")
        fn = getattr(self.lib, "cuvil_get_thread_stats", None)
        if fn is None:
            return None
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        out = (ctypes.c_int64 * ThreadStats.COUNT)()
        if fn(self._handle, out, ThreadStats.COUNT) < ThreadStats.COUNT:
            return None
        return ThreadStats(calls=out[0], regions=out[1], declined_regions=out[2], tasks=out[3],
                           worker_tasks=out[4], wait_s=out[5] * 1e-9, wait_estimate_s=out[6] * 1e-9)

    def loaded_weights(self) -> bytes | None:
        """A copy of the weights buffer the loaded model holds now (None when it holds none)."""
        if self._handle is None or not self._handle.value:
            raise CuvilError("the model was closed")
        # struct cuvil_model starts with { const unsigned char *weights; size_t size; } (codegen.py)
        head = (ctypes.c_size_t * 2).from_address(self._handle.value)
        return ctypes.string_at(head[0], head[1]) if head[0] else None

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.lib.cuvil_unload(self._handle)
            self._handle = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

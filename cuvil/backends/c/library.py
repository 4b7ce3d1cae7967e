"""Loading a compiled model library with ctypes and calling it.

ctypes releases the GIL for the duration of each foreign call, so calls
from several Python threads run in parallel; each call owns its memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType

MAX_RANK = 8
_CODE_TO_DTYPE = {ct.code(d): d for d in DType}


class RunError(CuvilError):
    """The compiled model reported an error while running."""


class CTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("shape", ctypes.c_int64 * MAX_RANK),
        ("rank", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
    ]


class NativeModel:
    """A loaded model library and its weights."""

    def __init__(self, library: Path, weights: Path | None) -> None:
        self.path = library
        self.lib = ctypes.CDLL(str(library))
        lib = self.lib
        lib.cuvil_load.restype = ctypes.c_void_p
        lib.cuvil_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.cuvil_unload.argtypes = [ctypes.c_void_p]
        lib.cuvil_unload.restype = None
        lib.cuvil_run.restype = ctypes.c_int
        lib.cuvil_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(CTensor), ctypes.POINTER(CTensor), ctypes.c_char_p,
                                  ctypes.c_size_t]
        lib.cuvil_free.argtypes = [ctypes.c_void_p]
        lib.cuvil_free.restype = None
        lib.cuvil_num_outputs.restype = ctypes.c_int
        self.n_outputs = int(lib.cuvil_num_outputs())
        err = ctypes.create_string_buffer(1024)
        handle = lib.cuvil_load(str(weights).encode() if weights else None, err, len(err))
        if not handle:
            raise CuvilError(f"cannot load model weights: {err.value.decode(errors='replace')}")
        self._handle: ctypes.c_void_p | None = ctypes.c_void_p(handle)

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        arrays = [np.asarray(a, order="C") for a in inputs]  # (ascontiguousarray makes 0-D arrays 1-D)
        ins = (CTensor * max(len(arrays), 1))()
        for t, a in zip(ins, arrays):
            t.data = a.ctypes.data
            t.rank = a.ndim
            t.dtype = ct.code(DType.from_np(a.dtype))
            for j, n in enumerate(a.shape):
                t.shape[j] = n
        outs = (CTensor * max(self.n_outputs, 1))()
        err = ctypes.create_string_buffer(1024)
        if self._handle is None:
            raise CuvilError("the model was closed")
        rc = self.lib.cuvil_run(self._handle, ins, outs, err, len(err))
        if rc != 0:
            raise RunError(err.value.decode("utf-8", errors="replace"))
        results = []
        for t in outs[: self.n_outputs]:
            dt = _CODE_TO_DTYPE[t.dtype].np
            shape = tuple(t.shape[j] for j in range(t.rank))
            count = int(np.prod(shape, dtype=np.int64))
            if count == 0:
                results.append(np.zeros(shape, dt))
                self.lib.cuvil_free(t.data)
                continue
            # zero-copy: the array views the buffer the model allocated, freed with the array
            buf = (ctypes.c_char * (count * dt.itemsize)).from_address(t.data)
            arr = np.frombuffer(memoryview(buf), dtype=dt).reshape(shape)
            weakref.finalize(arr.base if arr.base is not None else arr, self.lib.cuvil_free, t.data)
            results.append(arr)
        del arrays
        return results

    def close(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.lib.cuvil_unload(self._handle)
            self._handle = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

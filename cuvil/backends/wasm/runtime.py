"""Running a model's WebAssembly module with wasmtime, through the C API of ``cuvil_api.h``.

One wasmtime Engine and one compiled Module serve every thread; a Store and
its Instance are not thread-safe, so each thread that calls the model gets
its own instance (thread-local), with its own linear memory and its own copy
of the weights, loaded once. wasmtime releases the GIL while wasm runs, so
threads run in parallel.

Memory between host and module follows docs/wasm.md: the host allocates
inputs, tensor records and the error buffer with ``cuvil_malloc``, copies the
inputs in, calls ``cuvil_run``, copies the outputs out and frees everything
(outputs included) with ``cuvil_free``. Every pointer and length the module
hands back is checked against the memory's size before the host reads it.
"""

from __future__ import annotations

import ctypes
import importlib
import math
import struct
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.library import MAX_RANK, RunError
from cuvil.backends.wasm.toolchain import EXPORTS
from cuvil.errors import CuvilError, InputError
from cuvil.ir.dtypes import DType

# struct cuvil_tensor on wasm32: void *data (4 bytes, then 4 of padding so that the int64s
# are 8-aligned), int64_t shape[8], int32_t rank, int32_t dtype. 80 bytes, aligned to 8.
TENSOR = struct.Struct(f"<I4x{MAX_RANK}qii")
TENSOR_DATA, TENSOR_SHAPE, TENSOR_RANK, TENSOR_DTYPE = 0, 8, 8 + 8 * MAX_RANK, 12 + 8 * MAX_RANK
ERR_LEN = 1024
WEIGHT_ALIGN = 64  # codegen lays constants out at multiples of 64 bytes from the weights' start

_CODE_TO_DTYPE = {ct.code(d): d for d in DType}


def _wasmtime() -> Any:
    try:
        return importlib.import_module("wasmtime")
    except ImportError:
        raise CuvilError("the wasm32 target needs the 'wasmtime' package (pip install 'cuvil[wasm]')") from None


def _arg(x: int) -> int:
    """A wasm32 pointer or size as the i32 a wasm function takes (the bits, signed)."""
    return x - (1 << 32) if x >= 1 << 31 else x


def _addr(x: int) -> int:
    """A wasm32 pointer returned as an i32, as the unsigned address it is."""
    return x & 0xFFFFFFFF


def _align(x: int) -> int:
    return (x + WEIGHT_ALIGN - 1) // WEIGHT_ALIGN * WEIGHT_ALIGN


class WasmInstance:
    """One instance of a model's module with its weights loaded: used by one thread at a time."""

    def __init__(self, engine: Any, module: Any, weights: bytes) -> None:
        wasmtime = _wasmtime()
        self.store = wasmtime.Store(engine)
        self.store.set_wasi(wasmtime.WasiConfig())  # no files, environment, arguments or stdio
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        exports = linker.instantiate(self.store, module).exports(self.store)
        self.memory = exports["memory"]
        self._fn: dict[str, Any] = {name: exports[name] for name in EXPORTS}
        exports["_initialize"](self.store)  # the reactor's C constructors, once, before any other export
        self.n_inputs = int(self.call("cuvil_num_inputs"))
        self.n_outputs = int(self.call("cuvil_num_outputs"))
        self.err = self.malloc(ERR_LEN)
        # The weights stay in this instance's memory for its lifetime (cuvil_load_from_memory keeps a pointer).
        raw = self.malloc(len(weights) + WEIGHT_ALIGN - 1)
        at = _align(raw)
        self.write(at, weights)
        handle = _addr(self.call("cuvil_load_from_memory", _arg(at), _arg(len(weights)), _arg(self.err), ERR_LEN))
        if handle == 0:
            raise CuvilError(f"cannot load the model's weights: {self.error_text()}")
        self.handle = handle

    def call(self, name: str, *args: int) -> Any:
        """Call an exported function of the model API."""
        return self._fn[name](self.store, *args)

    # linear memory ---------------------------------------------------------------
    def _span(self, at: int, n: int) -> int:
        """The host address of wasm bytes [at, at + n), after checking they lie in the memory."""
        size = self.memory.data_len(self.store)
        if at < 0 or n < 0 or at + n > size:
            raise RunError(f"the WebAssembly module handed back bytes [{at}, {at + n}) outside its memory ({size} bytes)")
        return ctypes.addressof(self.memory.data_ptr(self.store).contents) + at

    def write(self, at: int, data: bytes | np.ndarray) -> None:
        n = data.nbytes if isinstance(data, np.ndarray) else len(data)
        if n:
            src = data.ctypes.data if isinstance(data, np.ndarray) else data
            ctypes.memmove(self._span(at, n), src, n)

    def read(self, at: int, n: int) -> bytes:
        return ctypes.string_at(self._span(at, n), n) if n else b""

    def malloc(self, n: int) -> int:
        if n > 0xFFFFFFFF:
            raise RunError(f"{n} bytes do not fit in the 4 GiB memory of a wasm32 instance")
        p = _addr(self.call("cuvil_malloc", _arg(n)))
        if p == 0:
            raise RunError(f"the WebAssembly instance is out of memory (allocating {n} bytes)")
        return p

    def free(self, p: int) -> None:
        self.call("cuvil_free", _arg(p))

    def error_text(self) -> str:
        raw = self.read(self.err, ERR_LEN)
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")

    # a call ------------------------------------------------------------------------
    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run the model on C-contiguous arrays (already validated by the caller; the module checks again)."""
        if len(arrays) != self.n_inputs:
            raise InputError(f"the model takes {self.n_inputs} inputs, got {len(arrays)}")
        # One block holds the input records, the output records and the input data (each array 64-aligned):
        # the fewer calls into wasm, the less each run costs.
        outs = TENSOR.size * max(self.n_inputs, 1)
        end = outs + TENSOR.size * max(self.n_outputs, 1)
        data: list[int] = []
        for a in arrays:
            end = _align(end)
            data.append(end)
            end += a.nbytes
        raw = self.malloc(end + WEIGHT_ALIGN - 1)
        try:
            base = _align(raw)
            records = bytearray(data[0] if data else end)  # input and output records, zeroed
            for i, (a, at) in enumerate(zip(arrays, data)):
                shape = list(a.shape) + [0] * (MAX_RANK - a.ndim)
                TENSOR.pack_into(records, i * TENSOR.size, base + at, *shape, a.ndim, ct.code(DType.from_np(a.dtype)))
                self.write(base + at, a)
            self.write(base, bytes(records))
            rc = self.call("cuvil_run", _arg(self.handle), _arg(base), _arg(base + outs), _arg(self.err), ERR_LEN)
            if rc != 0:
                raise RunError(self.error_text())
            return self._take_outputs(base + outs)
        finally:
            self.free(raw)

    def _take_outputs(self, outs: int) -> list[np.ndarray]:
        """Copy the outputs out of the instance, then free them (all of them, also when one is malformed)."""
        records = [TENSOR.unpack(self.read(outs + i * TENSOR.size, TENSOR.size)) for i in range(self.n_outputs)]
        try:
            results = []
            for rec in records:
                data, shape, rank, code = rec[0], rec[1:1 + MAX_RANK], rec[1 + MAX_RANK], rec[2 + MAX_RANK]
                if code not in _CODE_TO_DTYPE or not 0 <= rank <= MAX_RANK or any(d < 0 for d in shape[:rank]):
                    raise RunError(f"the WebAssembly module returned a malformed output (dtype code {code}, rank {rank})")
                dt = _CODE_TO_DTYPE[code].np
                nbytes = math.prod(shape[:rank]) * dt.itemsize
                src = self._span(data, nbytes)  # checked before anything is allocated here
                out = np.empty(tuple(shape[:rank]), dtype=dt)
                if nbytes:
                    ctypes.memmove(out.ctypes.data, src, nbytes)
                results.append(out)
            return results
        finally:
            for rec in records:
                if rec[0]:
                    self.free(rec[0])


class WasmModel:
    """A model's compiled WebAssembly module and its weights, callable from any number of threads."""

    def __init__(self, wasm: Path, weights: Path) -> None:
        if sys.byteorder != "little":
            raise CuvilError("the wasm32 runtime copies arrays as they are in memory: it needs a little-endian host")
        wasmtime = _wasmtime()
        self._wasmtime = wasmtime
        self.path = wasm
        self.engine = wasmtime.Engine()
        self.module = wasmtime.Module.from_file(self.engine, str(wasm))
        exported = {e.name for e in self.module.exports}
        missing = [n for n in ("memory", "_initialize", *EXPORTS) if n not in exported]
        if missing:
            raise CuvilError(f"{wasm} is not a Cuvil model module: it does not export {', '.join(missing)}")
        self.weights = weights.read_bytes()
        self._local = threading.local()
        first = self._instance()  # load errors surface now, not at the first call
        self.n_inputs, self.n_outputs = first.n_inputs, first.n_outputs

    def _instance(self) -> WasmInstance:
        inst: WasmInstance | None = getattr(self._local, "instance", None)
        if inst is None:
            inst = WasmInstance(self.engine, self.module, self.weights)
            self._local.instance = inst
        return inst

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        arrays = [np.asarray(a, order="C") for a in inputs]  # (ascontiguousarray makes 0-D arrays 1-D)
        try:
            return self._instance().run(arrays)
        except (self._wasmtime.Trap, self._wasmtime.WasmtimeError) as exc:
            # A trap leaves the instance mid-call (its allocator may be inconsistent): start afresh next time.
            self._local.instance = None
            raise RunError(f"the WebAssembly module trapped: {exc}") from None

"""The C backend's kernel table and what a kernel emitter sees.

A kernel emitter writes the C for one node.  Before it runs, the code
generator has assigned every output dim it can derive (from the op's
inference, re-run on the node's run-time input shapes) and allocated the
outputs.  A kernel registered with ``computes_shape=True`` gets outputs
whose data-dependent dims are left to it: it assigns them, then calls
:meth:`KernelCtx.alloc`.

Kernels must never read or write out of bounds for inputs that passed the
model's input checks: every shape relation a kernel relies on that the IR
does not already guarantee is checked at run time (:meth:`KernelCtx.require`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.writer import CWriter, c_string
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Node, Value

if TYPE_CHECKING:
    from cuvil.backends.c.codegen import FunctionEmitter

_log = logging.getLogger(__name__)


@dataclass
class CVal:
    """A tensor as generated C sees it: a data pointer and a shape array."""

    value: Value
    ptr: str
    shape: str
    dtype: DType
    rank: int
    const: np.ndarray | None = None

    def dim(self, j: int) -> str:
        """Dim ``j`` as a C expression (a literal when it is static)."""
        d = self.value.type.shape[j]
        return str(d) if isinstance(d, int) else f"{self.shape}[{j}]"

    def static_dim(self, j: int) -> int | None:
        d = self.value.type.shape[j]
        return d if isinstance(d, int) else None

    def numel(self) -> str:
        if self.rank == 0:
            return "INT64_C(1)"
        return "(" + " * ".join(f"(int64_t){self.dim(j)}" for j in range(self.rank)) + ")"

    @property
    def ctype(self) -> str:
        return ct.storage(self.dtype)

    @property
    def ctype_compute(self) -> str:
        return ct.compute(self.dtype)

    def load(self, index: str) -> str:
        return ct.load(self.dtype, self.ptr, index)

    def store(self, index: str, expr: str) -> str:
        return ct.store(self.dtype, self.ptr, index, expr)


KernelFn = Callable[["KernelCtx"], None]


@dataclass(frozen=True)
class Kernel:
    emit: KernelFn
    computes_shape: bool = False
    # The kernel reads element i of each operand before it writes element i of its output and reads
    # nothing else of that operand, so the memory planner (memplan.py) may put its output over an
    # input of the same element type and shape that dies at this node (KernelCtx.in_place says when).
    in_place: bool = False


_KERNELS: dict[str, Kernel] = {}


def kernel(*ops: str, computes_shape: bool = False, in_place: bool = False) -> Callable[[KernelFn], KernelFn]:
    """Register the C emitter of one or more ops."""

    def wrap(fn: KernelFn) -> KernelFn:
        for op in ops:
            _KERNELS[op] = Kernel(fn, computes_shape, in_place)
        return fn

    return wrap


def find_kernel(op: str) -> Kernel | None:
    return _KERNELS.get(op)


def unregister_kernel(op: str) -> None:
    """Remove an op's emitter (custom ops registered at run time: cuvil/backends/c/kernels/custom.py)."""
    _KERNELS.pop(op, None)


def kernel_ops() -> set[str]:
    return set(_KERNELS)


class KernelCtx:
    """What a kernel emitter sees for one node."""

    def __init__(
        self,
        fn: FunctionEmitter,
        node: Node,
        ins: Sequence[CVal | None],
        outs: Sequence[CVal],
        allocated: Sequence[bool] | None = None,
    ) -> None:
        self._fn = fn
        self.node = node
        # Whether the generator already allocated each output (all its dims were derivable); a kernel
        # with ``computes_shape=True`` calls :meth:`alloc` only for the outputs where this is False.
        self.allocated = list(allocated) if allocated is not None else [True] * len(outs)
        self.attrs: dict[str, Any] = node.attrs
        self.ins = list(ins)
        self.outs = list(outs)
        self.w: CWriter = fn.w
        self.options = fn.options
        # An elementwise tail that a fused kernel (kernels/fused.py) offers to its base op's emitter:
        # a C expression of type ``const cuvil_sgemm_epilogue *`` (cuvil_gemm.h) that finishes each
        # element of output 0 in place.  A kernel that applies it (to every element, exactly once)
        # sets ``epilogue_applied``; otherwise the fused kernel applies it after the base kernel.
        self.epilogue: str | None = None
        # The same tail when it is only a clamp (``relu``, or ``clip`` by bounds known not to be NaN),
        # offered to kernels that round an f16/bf16 result: C expressions of the lower and upper
        # bound (-INFINITY / INFINITY for none), to apply as NaN-passing max then min before the
        # rounding (which commutes with them: the bounds are values of the result's type).
        self.clamp: tuple[str, str] | None = None
        self.epilogue_applied = False

    def derive(self, node: Node, ins: Sequence[CVal | None], outs: Sequence[CVal],
               allocated: Sequence[bool] | None = None) -> KernelCtx:
        """A context for ``node`` emitted into the same C function (a fused kernel running its base op's emitter)."""
        return type(self)(self._fn, node, ins, outs, allocated)

    def inp(self, i: int) -> CVal:
        v = self.ins[i] if i < len(self.ins) else None
        if v is None:
            raise ValueError(f"{self.node.op}: input {i} is missing")
        return v

    def has(self, i: int) -> bool:
        return i < len(self.ins) and self.ins[i] is not None

    def out(self, i: int = 0) -> CVal:
        return self.outs[i]

    def const(self, i: int) -> np.ndarray | None:
        return self.ins[i].const if self.has(i) else None  # type: ignore[union-attr]

    @property
    def in_place(self) -> bool:
        """Whether an output of this node shares memory with one of its inputs (a kernel registered
        ``in_place`` whose output the memory plan put over a dying input): its C must not use
        ``restrict`` pointers between them."""
        return self._fn.computes_in_place(self.node)

    def note(self, text: str) -> None:
        """Say which implementation this kernel chose for the node, and why (logged at DEBUG)."""
        _log.debug("node %r (%s): %s", self.node.name, self.node.op, text)

    def include(self, header: str) -> None:
        """Have the generated file include a runtime header (``cuvil/backends/c/runtime/``)."""
        self._fn.includes.add(header)

    def enable(self, macro: str, bit: int) -> None:
        """Set ``bit`` of one of the bit sets the runtime headers read (``codegen.BIT_SETS``), e.g.
        the Winograd tile sizes the unit compiles; the generated file defines each before its
        includes, so that the headers compile only what its kernels run."""
        self._fn.bitsets[macro] |= 1 << bit

    def define(self, key: str, text: str) -> None:
        """Add file-scope C (functions, types) to the generated unit, once per ``key``, after the includes."""
        self._fn.definitions.setdefault(key, text)

    def tmp(self, hint: str = "t") -> str:
        return self._fn.names.fresh(hint)

    def fail_if(self, cond: str, message: str, *args: str) -> None:
        """Emit a run-time check: when ``cond`` holds, the call fails with ``message``.

        ``message`` is a printf format written by Cuvil (never model text); the
        node's name is prepended safely as an argument."""
        fmt = c_string(f"node %s ({self.node.op}): {message}")
        extra = "".join(f", {a}" for a in args)
        self.w.line(f"if (CUVIL_UNLIKELY({cond})) {{ cuvil_fail(call, {fmt}, {c_string(self.node.name)}{extra}); goto fail; }}")

    def require(self, a: str, b: str, what: str) -> None:
        """Check at run time that two C int64 expressions are equal (skipped when textually equal)."""
        if a == b:
            return
        self.fail_if(f"(int64_t)({a}) != (int64_t)({b})", f"{what}: %lld != %lld", f"(long long)({a})", f"(long long)({b})")

    def alloc(self, i: int = 0) -> None:
        """Allocate output ``i`` from its shape array (kernels that compute their own shape)."""
        self._fn.alloc_value(self.outs[i], self.node)

    def release(self, ptr: str) -> None:
        self.w.line(f"cuvil_release(call, {ptr});")

    def scratch(self, ctype: str, count: str, hint: str = "buf") -> str:
        """A call-owned zeroed buffer of ``count`` elements; returns its C name (release it yourself)."""
        name = self.tmp(hint)
        self.w.line(f"{ctype} *{name} = ({ctype} *)cuvil_alloc(call, (int64_t)sizeof({ctype}) * (int64_t)({count}));")
        self.fail_if(f"!{name}", "out of memory")
        return name

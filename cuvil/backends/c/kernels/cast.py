"""Kernels of ``cast`` (every pair of element types) and ``full_like``.

Conversions follow ``cuvil/ops/cast.py``:

* float to float rounds to nearest even, once: float64 to float16 has its
  own conversion (through float32 would round twice); float64 to bfloat16
  goes through float32, as the reference (ml_dtypes) does;
* float to integer truncates toward zero; ONNX leaves NaN, infinities and
  out-of-range values undefined, and C makes them undefined behaviour, so
  Cuvil defines them: they saturate to the target's range, NaN gives 0
  (``cuvil_f2i_*`` in ``cuvil_math.h``; WebAssembly's ``trunc_sat``);
* integer to integer keeps the low bits; anything to bool is ``x != 0``
  (NaN is true); bool to a number is 0 or 1;
* to and from the low-bit storage types (``cuvil/ops/lowbit.py``): read
  exactly into their compute type (``cuvil_from_<type>``), written by
  ``cuvil_to_<type>`` (``cuvil_lowbit.h``): float8/float4 from float32 (a double
  is rounded to float first) with the node's ``saturate``; 4- and 2-bit integers
  from the low bits of an integer, a float first truncated by
  ``cuvil_lowbit_trunc``.  A low-bit float source counts as a float.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import copy, elementwise
from cuvil.backends.c.kernels.elementwise import MATH_HEADER, SCALAR, Scalar
from cuvil.backends.c.writer import c_float, c_int
from cuvil.ir.dtypes import FLOATS, INTS, LOWBIT, LOWBIT_FLOATS, DType


def cast(s: Scalar, a: Sequence[str]) -> str:
    """Operand ``a[0]`` (in its compute type) converted to the output's compute type.

    Float16 from float64 is the one conversion that bypasses the output's
    compute type: its kernel stores with :func:`cast_store`."""
    src, dst, x = s.dtype, s.out, a[0]
    if dst is DType.bool:
        return f"({x} != 0)"
    if src is DType.bool:
        return f"({ct.compute(dst)})({x} != 0)"
    if src.holds_floats and dst in INTS:
        return f"cuvil_f2i_{dst.value}({x})"
    return f"({ct.compute(dst)})({x})"


def _to_lowbit(src: DType, dst: DType, x: str, saturate: bool) -> str:
    """Operand ``x`` (``src``'s compute type) as the byte of low-bit type ``dst``."""
    if src is DType.bool:
        x = f"({x} != 0)"
    if dst in LOWBIT_FLOATS:
        return f"cuvil_to_{dst.value}((float)({x}), {int(saturate)})"
    if src.holds_floats:
        x = f"cuvil_lowbit_trunc((double)({x}))"
    return f"cuvil_to_{dst.value}((uint32_t)({x}))"


SCALAR["cast"] = cast


@kernel("cast")
def _cast(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    if x.dtype is out.dtype:
        copy(k, x, out)
        return
    k.include(MATH_HEADER)
    if x.dtype in LOWBIT or out.dtype in LOWBIT:
        k.include(ct.LOWBIT_HEADER)
    if out.dtype in LOWBIT:  # the byte is made here (with the node's saturate) and stored as it is
        sat = bool(k.attrs.get("saturate", 1))
        elementwise(k, lambda a: _to_lowbit(x.dtype, out.dtype, a[0], sat), [x], replace(out, dtype=DType.u8))
        return
    s = Scalar((x.dtype,), out.dtype)
    if x.dtype is DType.f64 and out.dtype is DType.f16:
        # rounded once from double: elementwise() stores through float, so write the bits as u16
        elementwise(k, lambda a: f"cuvil_f64_to_f16({a[0]})", [x], replace(out, dtype=DType.u16))
        return
    elementwise(k, lambda a: cast(s, a), [x], out)


def literal(value: np.ndarray, dt: DType) -> str:
    """A C expression of ``dt``'s storage type holding the one element of ``value`` exactly."""
    if dt is DType.bool:
        return "1" if bool(value) else "0"
    if dt in (DType.f16, DType.bf16):
        bits = int(np.asarray(value, dtype=dt.np).view(np.uint16))
        return f"(({ct.storage(dt)})0x{bits:04x}u)"
    if dt in FLOATS:
        return c_float(float(value), "f" if dt is DType.f32 else "")
    if dt is DType.u64:
        return f"UINT64_C({int(value)})"
    return f"({ct.storage(dt)}){c_int(int(value))}"


@kernel("full_like")
def _full_like(k: KernelCtx) -> None:
    out = k.out(0)
    value = np.asarray(k.attrs["value"]).reshape(())
    lit = literal(value, out.dtype)
    i, n = k.tmp("i"), k.tmp("n")
    k.w.line(f"const int64_t {n} = {out.numel()};")
    with k.w.block(f"for (int64_t {i} = 0; {i} < {n}; {i}++)"):
        k.w.line(f"{out.ptr}[{i}] = {lit};")

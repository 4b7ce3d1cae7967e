"""Kernels of comparisons, boolean logic, bitwise logic and shifts, float classification (is_nan,
is_inf) and ``where``.

Comparisons compute in the operands' compute type (float16/bfloat16 as
float) and store ``bool``.  Boolean operands are normalised with ``!= 0`` so
that any non-zero byte counts as true.  ``where`` moves elements without
converting them (a float16 NaN keeps its payload).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import elementwise
from cuvil.backends.c.kernels.elementwise import SCALAR, Scalar, elementwise_op
from cuvil.ir.dtypes import DType


def _comparison(op: str, c_op: str) -> None:
    def expr(s: Scalar, a: Sequence[str]) -> str:
        return f"({a[0]} {c_op} {a[1]})"

    expr.__name__ = op
    elementwise_op(op)(expr)


for _op, _c in (("equal", "=="), ("greater", ">"), ("greater_or_equal", ">="), ("less", "<"), ("less_or_equal", "<=")):
    _comparison(_op, _c)


def _truth(x: str) -> str:
    return f"({x} != 0)"


@elementwise_op("and")
def and_(s: Scalar, a: Sequence[str]) -> str:
    return f"({_truth(a[0])} & {_truth(a[1])})"


@elementwise_op("or")
def or_(s: Scalar, a: Sequence[str]) -> str:
    return f"({_truth(a[0])} | {_truth(a[1])})"


@elementwise_op("xor")
def xor(s: Scalar, a: Sequence[str]) -> str:
    return f"({_truth(a[0])} ^ {_truth(a[1])})"


@elementwise_op("not")
def not_(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} == 0)"


@elementwise_op("bitwise_and")
def bitwise_and(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} & {a[1]})"


@elementwise_op("bitwise_or")
def bitwise_or(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} | {a[1]})"


@elementwise_op("bitwise_xor")
def bitwise_xor(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} ^ {a[1]})"


@elementwise_op("bitwise_not")
def bitwise_not(s: Scalar, a: Sequence[str]) -> str:
    return f"(~{a[0]})"  # the compute type's higher bits are dropped on store


@elementwise_op("bit_shift")
def bit_shift(s: Scalar, a: Sequence[str]) -> str:
    """Unsigned operands (computed in uint32_t or uint64_t); a shift by the element type's width or
    more gives 0, where C would be undefined past the compute type's width."""
    bits = s.dtype.np.itemsize * 8
    op = "<<" if s.attrs.get("direction") == "LEFT" else ">>"
    return f"({a[1]} >= {bits}u ? ({s.ctype})0 : ({s.ctype})({a[0]} {op} {a[1]}))"


@elementwise_op("is_nan")
def is_nan(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} != {a[0]})"


@elementwise_op("is_inf")
def is_inf(s: Scalar, a: Sequence[str]) -> str:
    x = a[0]
    pos, neg = bool(s.attrs.get("detect_positive", 1)), bool(s.attrs.get("detect_negative", 1))
    inf = "INFINITY" if s.dtype is not DType.f64 else "(double)INFINITY"
    tests = ([f"{x} == {inf}"] if pos else []) + ([f"{x} == -{inf}"] if neg else [])
    return "(" + " || ".join(tests) + ")" if tests else "0"


def where(s: Scalar, a: Sequence[str]) -> str:
    return f"({_truth(a[0])} ? {a[1]} : {a[2]})"


SCALAR["where"] = where

# Element types whose elements where() moves as raw bits of the same width.
_RAW = {DType.f16: DType.u16, DType.bf16: DType.u16}


@kernel("where")
def _where(k: KernelCtx) -> None:
    cond, x, y = k.inp(0), k.inp(1), k.inp(2)
    out = k.out(0)
    raw = _RAW.get(out.dtype)
    if raw is not None:
        x, y, out = replace(x, dtype=raw), replace(y, dtype=raw), replace(out, dtype=raw)
    s = Scalar((cond.dtype, x.dtype, y.dtype), out.dtype)
    elementwise(k, lambda args: where(s, args), [cond, x, y], out)

"""Kernels of elementwise arithmetic and unary math, and the scalar-expression table they share.

Every elementwise op's C is one small function, its *scalar expression*:
``fn(s, args) -> str`` turns its operands (C expressions in their compute
types) into the result (a C expression in the output's compute type).  The
expressions are kept in :data:`SCALAR`, keyed by op name, so that a fusion
pass can compose them; the kernels here only wrap them in the broadcasting
loop of :func:`~cuvil.backends.c.kernels.common.elementwise`.

Numerics follow the reference interpreter (``cuvil/ops/elementwise.py``):
float16/bfloat16 are computed in float and rounded once on store; integer
arithmetic wraps around (computed in unsigned types, so C never overflows a
signed type); integer division and remainder by zero give 0
(``cuvil_math.h``).  Activations are in ``activations.py``, comparisons and
logic in ``logic.py``, ``cast`` in ``cast.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import elementwise
from cuvil.backends.c.writer import c_float
from cuvil.ir.dtypes import FLOATS, SIGNED_INTS, DType
from cuvil.ir.graph import Value
from cuvil.ops.common import const_of

MATH_HEADER = "cuvil_math.h"


@dataclass(frozen=True)
class Scalar:
    """What an op's scalar expression depends on besides its operands."""

    dtypes: tuple[DType, ...]  # operand element types
    out: DType
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def dtype(self) -> DType:
        """The element type of the first operand (the one most ops compute in)."""
        return self.dtypes[0]

    @property
    def ctype(self) -> str:
        """The first operand's compute type."""
        return ct.compute(self.dtype)

    @property
    def is_double(self) -> bool:
        return self.dtype is DType.f64

    def lit(self, x: float) -> str:
        """A float constant in the first operand's float compute type (float or double)."""
        return c_float(x, "" if self.is_double else "f")

    def fn(self, name: str) -> str:
        """The C math function ``name`` for the compute type: ``exp`` -> ``expf`` in float."""
        return name if self.is_double else f"{name}f"

    def helper(self, name: str) -> str:
        """A ``cuvil_math.h`` helper for the compute type: ``max`` -> ``cuvil_max_f``."""
        return f"cuvil_{name}_{_SUFFIX[self.ctype]}"


ScalarFn = Callable[[Scalar, Sequence[str]], str]

_SUFFIX = {"float": "f", "double": "d", "int32_t": "i32", "int64_t": "i64", "uint32_t": "u32", "uint64_t": "u64"}

SCALAR: dict[str, ScalarFn] = {}
"""The scalar expression of every elementwise op with a C kernel."""


def scalar_ctx(k: KernelCtx) -> Scalar:
    ins = [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    return Scalar(tuple(a.dtype for a in ins), k.out(0).dtype, k.attrs)


def elementwise_op(*ops: str) -> Callable[[ScalarFn], ScalarFn]:
    """Register ``fn`` as the scalar expression of ``ops`` and give them a broadcasting kernel."""

    def wrap(fn: ScalarFn) -> ScalarFn:
        for op in ops:
            SCALAR[op] = fn

            @kernel(op, in_place=True)  # the broadcasting loop reads element i before writing it
            def emit(k: KernelCtx, fn: ScalarFn = fn) -> None:
                k.include(MATH_HEADER)
                s = scalar_ctx(k)
                elementwise(k, lambda args: fn(s, args))

        return fn

    return wrap


def is_float(s: Scalar) -> bool:
    return s.dtype in FLOATS


def wrapping(s: Scalar, op: str, a: str, b: str) -> str:
    """``a op b`` (op one of + - *) that wraps around instead of overflowing a signed type.

    int8/int16 compute in int32, where + - * of two of them cannot overflow."""
    if s.ctype in ("int32_t", "int64_t") and s.dtype in (DType.i32, DType.i64):
        name = {"+": "add", "-": "sub", "*": "mul"}[op]
        return f"{s.helper(name)}({a}, {b})"
    return f"({a} {op} {b})"


def nan_max(s: Scalar, a: str, b: str, b_not_nan: bool = False) -> str:
    """NumPy's maximum: NaN from either operand propagates.  ``b_not_nan``: ``b`` is known not to
    be NaN (a literal, a constant), which makes the float test one compare and one select."""
    if not is_float(s):
        return f"({a} > {b} ? {a} : {b})"
    return f"{s.helper('max_nn' if b_not_nan else 'max')}({a}, {b})"


def nan_min(s: Scalar, a: str, b: str, b_not_nan: bool = False) -> str:
    if not is_float(s):
        return f"({a} < {b} ? {a} : {b})"
    return f"{s.helper('min_nn' if b_not_nan else 'min')}({a}, {b})"


def constant_not_nan(v: Value | None) -> bool:
    """Whether ``v`` is a constant (a ``constant`` node's value) with no NaN in it."""
    c = const_of(v)
    if c is None:
        return False
    return c.dtype.kind in "biu" or not bool(np.isnan(np.asarray(c).astype(np.float64)).any())


# Arithmetic ---------------------------------------------------------------------


@elementwise_op("add")
def add(s: Scalar, a: Sequence[str]) -> str:
    return wrapping(s, "+", a[0], a[1])


@elementwise_op("sub")
def sub(s: Scalar, a: Sequence[str]) -> str:
    return wrapping(s, "-", a[0], a[1])


@elementwise_op("mul")
def mul(s: Scalar, a: Sequence[str]) -> str:
    return wrapping(s, "*", a[0], a[1])


@elementwise_op("div")
def div(s: Scalar, a: Sequence[str]) -> str:
    """Float division, or integer division truncating toward zero (x / 0 = 0)."""
    if is_float(s):
        return f"({a[0]} / {a[1]})"
    return f"{s.helper('div')}({a[0]}, {a[1]})"


@elementwise_op("mod")
def mod(s: Scalar, a: Sequence[str]) -> str:
    """fmod=0: the sign of B (floor division's remainder); fmod=1: the sign of A (C's)."""
    trunc = s.attrs.get("fmod", 0) == 1
    if is_float(s):
        return f"{s.fn('fmod')}({a[0]}, {a[1]})" if trunc else f"{s.helper('mod')}({a[0]}, {a[1]})"
    if trunc and s.dtype not in SIGNED_INTS:
        return f"{s.helper('mod')}({a[0]}, {a[1]})"  # unsigned: both remainders agree
    return f"{s.helper('fmod' if trunc else 'mod')}({a[0]}, {a[1]})"


@elementwise_op("pow")
def pow_(s: Scalar, a: Sequence[str]) -> str:
    """X ** Y in X's element type; Y may have another numeric element type.

    A float base computes in float only when both are float/f16/bf16 (NumPy's
    float32 power), otherwise in double; an integer base with a float exponent
    is the double power truncated; integer ** integer wraps (``cuvil_pow_i64``)."""
    x, y = s.dtypes
    if x in FLOATS:
        if x is not DType.f64 and y in (DType.f32, DType.f16, DType.bf16):
            return f"powf({a[0]}, {a[1]})"
        return f"pow((double){a[0]}, (double){a[1]})"
    if y in FLOATS:
        return f"{_f2i(x)}(trunc(pow((double){a[0]}, (double){a[1]})))"
    return f"cuvil_pow_i64((int64_t){a[0]}, (int64_t){a[1]})"


def _f2i(dt: DType) -> str:
    """The saturating float -> ``dt`` conversion of ``cuvil_math.h``."""
    return f"cuvil_f2i_{dt.value}"


# Variadic -----------------------------------------------------------------------


def _fold(a: Sequence[str], combine: Callable[[str, str], str]) -> str:
    acc = a[0]
    for x in a[1:]:
        acc = combine(acc, x)
    return acc


@elementwise_op("max")
def max_(s: Scalar, a: Sequence[str]) -> str:
    return _fold(a, lambda x, y: nan_max(s, x, y))


@elementwise_op("min")
def min_(s: Scalar, a: Sequence[str]) -> str:
    return _fold(a, lambda x, y: nan_min(s, x, y))


@elementwise_op("sum")
def sum_(s: Scalar, a: Sequence[str]) -> str:
    return _fold(a, lambda x, y: f"({x} + {y})")


@elementwise_op("mean")
def mean(s: Scalar, a: Sequence[str]) -> str:
    return f"({sum_(s, a)} / {s.lit(len(a))})"


# Unary ----------------------------------------------------------------------------


@elementwise_op("neg")
def neg(s: Scalar, a: Sequence[str]) -> str:
    if s.dtype in (DType.i32, DType.i64):
        return f"{s.helper('neg')}({a[0]})"
    return f"(-{a[0]})"


@elementwise_op("abs")
def abs_(s: Scalar, a: Sequence[str]) -> str:
    """|X|; the most negative integer stays itself (wraps)."""
    if is_float(s):
        return f"{s.fn('fabs')}({a[0]})"
    if s.dtype not in SIGNED_INTS:
        return a[0]
    return f"({a[0]} < 0 ? {neg(s, a)} : {a[0]})"


@elementwise_op("sign")
def sign(s: Scalar, a: Sequence[str]) -> str:
    """-1, 0 or 1; NaN (and a zero's sign) stays."""
    x = a[0]
    if is_float(s):
        return f"({x} > 0 ? {s.lit(1)} : ({x} < 0 ? {s.lit(-1)} : {x}))"
    if s.dtype not in SIGNED_INTS:
        return f"({s.ctype})({x} > 0)"
    return f"({s.ctype})(({x} > 0) - ({x} < 0))"


@elementwise_op("reciprocal")
def reciprocal(s: Scalar, a: Sequence[str]) -> str:
    return f"({s.lit(1)} / {a[0]})"


@elementwise_op("round")
def round_(s: Scalar, a: Sequence[str]) -> str:
    """To the nearest integer, halves to even: rint in the default rounding mode."""
    return f"{s.fn('rint')}({a[0]})"


# Functions whose float version is the vectorisable one of cuvil_vmath.h (libm's cannot be vectorised).
_VMATH = {"exp": "cuvil_exp_f", "erf": "cuvil_erf_f", "tanh": "cuvil_tanh_f", "log": "cuvil_log_f"}


def _libm(name: str) -> None:
    """An op that is the C math function of the same name (in float, maybe ``cuvil_vmath.h``'s)."""

    def expr(s: Scalar, a: Sequence[str]) -> str:
        if name in _VMATH and not s.is_double:
            return f"{_VMATH[name]}({a[0]})"
        return f"{s.fn(name)}({a[0]})"

    expr.__name__ = name
    elementwise_op(name)(expr)


for _op in ("ceil", "floor", "sqrt", "exp", "log", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
            "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"):
    _libm(_op)

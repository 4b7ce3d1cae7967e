"""Elementwise ops: the declaration factories, unary math and broadcasting arithmetic.

Each op is declared through a small factory (:func:`unary`, :func:`binary`,
:func:`variadic`) so that its dtype rule, traits and math sit together; the
math of each op is one small function of NumPy arrays (its future scalar
definition).  Activations live in ``activations.py``, comparisons and logic
in ``logic.py``, ``cast`` in ``cast.py``.

Numerics: float16 and bfloat16 inputs are computed in float32 and rounded
once to the input type, which is what a correctly rounded half-precision
kernel gives (and what ONNX's expected outputs hold).  Integer arithmetic
wraps around like C's (two's complement); integer division truncates toward
zero.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from cuvil.ir.dtypes import FLOATS, INTS, NUMERIC, SIGNED_INTS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.common import broadcast_shapes
from cuvil.ops.registry import COMMUTATIVE, ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, register

ArrayFn = Callable[..., np.ndarray]
Validator = Callable[[InferCtx], None]

HALF_FLOATS = frozenset({DType.f16, DType.bf16})
_HALF_NP = frozenset(d.np for d in HALF_FLOATS)


def widen(x: np.ndarray) -> np.ndarray:
    """``x`` in float32 when it is float16/bfloat16 (so a result is rounded once), else ``x``."""
    return x.astype(np.float32) if x.dtype in _HALF_NP else x


def unary(
    name: str,
    fn: ArrayFn,
    *,
    dtypes: frozenset[DType] = FLOATS,
    attrs: dict[str, AttrSpec] | None = None,
    out_dtype: DType | None = None,
    validate: Validator | None = None,
    doc: str = "",
) -> OpDef:
    """Declare a one-input elementwise op; ``fn(x, **attrs)`` is its math.

    ``validate`` checks attribute values at inference time."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        ctx.require_dtype(0, dtypes)
        if validate is not None:
            validate(ctx)
        t = ctx.type(0)
        return [TensorType(out_dtype or t.dtype, t.shape)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            y = fn(widen(ctx.input(0)), **ctx.attrs)
        return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]

    return register(
        OpDef(
            name=name,
            inputs=("X",),
            attrs=attrs or {},
            infer=infer,
            reference=ref,
            traits=frozenset({ELEMENTWISE}),
            doc=doc,
        )
    )


def binary(
    name: str,
    fn: ArrayFn,
    *,
    dtypes: frozenset[DType] = NUMERIC,
    out_dtype: DType | None = None,
    commutative: bool = False,
    attrs: dict[str, AttrSpec] | None = None,
    validate: Validator | None = None,
    doc: str = "",
) -> OpDef:
    """Declare a two-input elementwise op (one element type) with NumPy broadcasting."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        dt = ctx.same_dtype(0, 1)
        ctx.require_dtype(0, dtypes)
        if validate is not None:
            validate(ctx)
        shape = broadcast_shapes(name, ctx.type(0).shape, ctx.type(1).shape, ctx=ctx)
        return [TensorType(out_dtype or dt, shape)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            y = fn(widen(ctx.input(0)), widen(ctx.input(1)), **ctx.attrs)
        return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]

    traits = {ELEMENTWISE} | ({COMMUTATIVE} if commutative else set())
    return register(
        OpDef(
            name=name,
            inputs=("A", "B"),
            attrs=attrs or {},
            infer=infer,
            reference=ref,
            traits=frozenset(traits),
            doc=doc,
        )
    )


def variadic(
    name: str,
    combine: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    dtypes: frozenset[DType],
    finish: Callable[[np.ndarray, int], np.ndarray] | None = None,
    doc: str = "",
) -> OpDef:
    """Declare an op folding one or more broadcast inputs with ``combine`` (then ``finish(acc, n)``)."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        n = len(ctx.types)
        if n == 0:
            raise ctx.fail("needs at least one input")
        dt = ctx.same_dtype(*range(n))
        ctx.require_dtype(0, dtypes)
        shape = broadcast_shapes(name, *(ctx.type(i).shape for i in range(n)), ctx=ctx)
        return [TensorType(dt, shape)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        xs = [widen(ctx.input(i)) for i in range(len(ctx.inputs))]
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        with np.errstate(all="ignore"):
            acc = np.broadcast_to(functools.reduce(combine, xs), shape)
            if finish is not None:
                acc = finish(acc, len(xs))
        return [np.asarray(acc).astype(ctx.out_dtype(), copy=False)]

    return register(
        OpDef(
            name=name,
            inputs=("inputs*",),
            infer=infer,
            reference=ref,
            traits=frozenset({ELEMENTWISE, COMMUTATIVE}),
            doc=doc,
        )
    )


# Arithmetic -------------------------------------------------------------------


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A / B; integers truncate toward zero (C semantics, as ONNX specifies)."""
    if a.dtype.kind not in "iu":
        return np.asarray(np.divide(a, b))
    q = np.floor_divide(a, b)
    if a.dtype.kind == "i":
        # floor and truncation differ when the division is inexact and the signs differ
        inexact = (a - q * b) != 0
        q = np.where(inexact & ((a < 0) != (b < 0)), q + 1, q)
    # ONNX leaves integer division by zero undefined; Cuvil defines it as 0 on every target
    return np.asarray(np.where(b == 0, np.zeros((), q.dtype), q).astype(q.dtype, copy=False))


def _mod(a: np.ndarray, b: np.ndarray, *, fmod: int) -> np.ndarray:
    """fmod=0: A - floor(A/B)*B (sign of B); fmod=1: A - trunc(A/B)*B (sign of A)."""
    return np.asarray(np.fmod(a, b) if fmod else np.mod(a, b))


def _validate_fmod(ctx: InferCtx) -> None:
    if ctx.attrs["fmod"] not in (0, 1):
        raise ctx.fail(f"fmod must be 0 or 1, got {ctx.attrs['fmod']}")


binary("add", np.add, commutative=True, doc="A + B")
binary("sub", np.subtract, doc="A - B")
binary("mul", np.multiply, commutative=True, doc="A * B")
binary("div", _div, doc="A / B (integers truncate toward zero)")
binary(
    "mod",
    _mod,
    attrs={"fmod": AttrSpec("int", 0)},
    validate=_validate_fmod,
    doc="Remainder: fmod=0 takes the sign of B (floor), fmod=1 the sign of A (truncation).",
)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A ** B in A's element type; B may have another element type."""
    # Float tests by DType, not numpy's kind: ml_dtypes' bfloat16 has kind "V".
    if DType.from_np(a.dtype).is_float:  # NumPy promotes to the wider type; the caller rounds to A's type once
        return np.asarray(np.power(a, b))
    if DType.from_np(b.dtype).is_float:  # integer base, float exponent: the float power truncated
        return np.trunc(np.power(a.astype(np.float64), b.astype(np.float64)))
    # integer ** integer wraps modulo 2**bits; computing in int64 then narrowing gives the same bits
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    y = np.power(a64, np.maximum(b64, 0))
    # a negative exponent leaves 1/a**|b| truncated: +-1 for |a| = 1, else 0
    neg = np.where(a64 == -1, np.where(b64 % 2 == 0, 1, -1), np.where(a64 == 1, 1, 0))
    return np.where(b64 < 0, neg, y)


def _pow_infer(ctx: InferCtx) -> list[TensorType]:
    dt = ctx.require_dtype(0, NUMERIC)
    ctx.require_dtype(1, NUMERIC)
    return [TensorType(dt, broadcast_shapes("pow", ctx.type(0).shape, ctx.type(1).shape, ctx=ctx))]


def _pow_ref(ctx: RefCtx) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        y = _pow(widen(ctx.input(0)), widen(ctx.input(1)))
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="pow",
        inputs=("X", "Y"),
        infer=_pow_infer,
        reference=_pow_ref,
        traits=frozenset({ELEMENTWISE}),
        doc="X ** Y with X's element type; Y may have another numeric element type.",
    )
)

variadic("max", np.maximum, dtypes=NUMERIC, doc="Elementwise maximum of the broadcast inputs (NaN propagates).")
variadic("min", np.minimum, dtypes=NUMERIC, doc="Elementwise minimum of the broadcast inputs (NaN propagates).")
variadic("sum", np.add, dtypes=FLOATS, doc="Elementwise sum of the broadcast inputs.")
variadic(
    "mean",
    np.add,
    dtypes=FLOATS,
    finish=lambda acc, n: acc / np.asarray(n, acc.dtype),
    doc="Elementwise mean of the broadcast inputs.",
)

# Unary math -------------------------------------------------------------------

# NumPy has no erf; math.erf/erfc are accurate to a few float64 ulps, far below any float type's rounding.
_erf_f64 = np.frompyfunc(math.erf, 1, 1)
_erfc_f64 = np.frompyfunc(math.erfc, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, in float64."""
    return np.asarray(_erf_f64(x.astype(np.float64)), dtype=np.float64)


def erfc(x: np.ndarray) -> np.ndarray:
    """1 - erf(x) in float64, without the cancellation of computing it that way."""
    return np.asarray(_erfc_f64(x.astype(np.float64)), dtype=np.float64)


unary("abs", np.abs, dtypes=NUMERIC, doc="|X| (the most negative integer stays itself)")
unary("neg", np.negative, dtypes=FLOATS | SIGNED_INTS, doc="-X")
unary("sign", np.sign, dtypes=NUMERIC, doc="-1, 0 or 1 by the sign of X (NaN stays NaN)")
unary("ceil", np.ceil)
unary("floor", np.floor)
unary("round", np.round, doc="Round to the nearest integer, halves to even")
unary("reciprocal", np.reciprocal, doc="1 / X")
unary("sqrt", np.sqrt)
unary("exp", np.exp)
unary("log", np.log)
unary("erf", erf, doc="The Gauss error function")
unary("sin", np.sin)
unary("cos", np.cos)
unary("tan", np.tan)
unary("asin", np.arcsin)
unary("acos", np.arccos)
unary("atan", np.arctan)
unary("sinh", np.sinh)
unary("cosh", np.cosh)
unary("tanh", np.tanh)
unary("asinh", np.arcsinh)
unary("acosh", np.arccosh)
unary("atanh", np.arctanh)

__all__ = ["HALF_FLOATS", "INTS", "binary", "erf", "erfc", "unary", "variadic", "widen"]

"""Comparisons, boolean logic, bitwise logic and shifts on integers, float classification (is_nan,
is_inf) and ``where``.

Comparisons and classifications produce ``bool``; the logical ops take and
give ``bool``; the bitwise ops and ``bit_shift`` take and give one integer type.
Every op broadcasts its inputs like NumPy.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import ALL, INTS, UNSIGNED_INTS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.common import broadcast_shapes
from cuvil.ops.elementwise import binary, unary
from cuvil.ops.registry import ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, register

BOOL = frozenset({DType.bool})

binary("equal", np.equal, dtypes=ALL, out_dtype=DType.bool, commutative=True, doc="A == B")
binary("greater", np.greater, out_dtype=DType.bool, doc="A > B")
binary("greater_or_equal", np.greater_equal, out_dtype=DType.bool, doc="A >= B")
binary("less", np.less, out_dtype=DType.bool, doc="A < B")
binary("less_or_equal", np.less_equal, out_dtype=DType.bool, doc="A <= B")

binary("and", np.logical_and, dtypes=BOOL, commutative=True, doc="A and B")
binary("or", np.logical_or, dtypes=BOOL, commutative=True, doc="A or B")
binary("xor", np.logical_xor, dtypes=BOOL, commutative=True, doc="A xor B")
unary("not", np.logical_not, dtypes=BOOL, doc="not X")

binary("bitwise_and", np.bitwise_and, dtypes=INTS, commutative=True, doc="A & B (integers)")
binary("bitwise_or", np.bitwise_or, dtypes=INTS, commutative=True, doc="A | B (integers)")
binary("bitwise_xor", np.bitwise_xor, dtypes=INTS, commutative=True, doc="A ^ B (integers)")
unary("bitwise_not", np.invert, dtypes=INTS, doc="~X (integers)")


def _bit_shift(a: np.ndarray, b: np.ndarray, *, direction: str) -> np.ndarray:
    """A shifted by B bits; a shift by the type's width or more gives 0 (C leaves it undefined)."""
    bits = a.dtype.itemsize * 8
    short = np.minimum(b, bits - 1).astype(a.dtype)
    shifted = np.left_shift(a, short) if direction == "LEFT" else np.right_shift(a, short)
    return np.where(b >= bits, np.zeros((), a.dtype), shifted)


def _validate_direction(ctx: InferCtx) -> None:
    if ctx.attrs["direction"] not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction must be LEFT or RIGHT, got {ctx.attrs['direction']!r}")


binary(
    "bit_shift",
    _bit_shift,
    dtypes=UNSIGNED_INTS,
    attrs={"direction": AttrSpec("str")},
    validate=_validate_direction,
    doc="A << B (direction LEFT) or A >> B (RIGHT), unsigned; shifting by the width or more gives 0.",
)


def _is_inf(x: np.ndarray, *, detect_negative: int, detect_positive: int) -> np.ndarray:
    return (np.isposinf(x) & bool(detect_positive)) | (np.isneginf(x) & bool(detect_negative))


unary("is_nan", np.isnan, out_dtype=DType.bool, doc="X is NaN")
unary(
    "is_inf",
    _is_inf,
    out_dtype=DType.bool,
    attrs={"detect_negative": AttrSpec("int", 1), "detect_positive": AttrSpec("int", 1)},
    doc="X is +inf (when detect_positive) or -inf (when detect_negative)",
)


def _where_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, BOOL)
    dt = ctx.same_dtype(1, 2)
    ctx.require_dtype(1, ALL)
    shape = broadcast_shapes("where", ctx.type(0).shape, ctx.type(1).shape, ctx.type(2).shape, ctx=ctx)
    return [TensorType(dt, shape)]


def _where_ref(ctx: RefCtx) -> list[np.ndarray]:
    y = np.where(ctx.input(0), ctx.input(1), ctx.input(2))
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="where",
        inputs=("condition", "X", "Y"),
        infer=_where_infer,
        reference=_where_ref,
        traits=frozenset({ELEMENTWISE}),
        doc="condition ? X : Y, the three inputs broadcast together.",
    )
)

__all__ = ["BOOL"]

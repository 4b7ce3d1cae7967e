"""Comparisons, boolean logic, float classification (is_nan, is_inf) and ``where``.

Comparisons and classifications produce ``bool``; the logical ops take and
give ``bool``.  Every op broadcasts its inputs like NumPy.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import ALL, DType
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

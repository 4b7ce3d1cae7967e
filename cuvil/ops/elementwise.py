"""Elementwise ops: unary math, binary arithmetic with broadcasting, comparisons, logic.

Each op is declared through a small factory so that its dtype rule, NumPy
reference and traits sit on one line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.ir.dtypes import ALL, FLOATS, INTS, NUMERIC, SIGNED_INTS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.common import broadcast_shapes
from cuvil.ops.registry import COMMUTATIVE, ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, register

ArrayFn = Callable[..., np.ndarray]


def unary(
    name: str,
    fn: ArrayFn,
    *,
    dtypes: frozenset[DType] = FLOATS,
    attrs: dict[str, AttrSpec] | None = None,
    out_dtype: DType | None = None,
    doc: str = "",
) -> OpDef:
    """Declare a one-input elementwise op; ``fn(x, **attrs)`` is its reference."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        ctx.require_dtype(0, dtypes)
        t = ctx.type(0)
        return [TensorType(out_dtype or t.dtype, t.shape)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        x = ctx.input(0)
        with np.errstate(all="ignore"):
            y = fn(x, **ctx.attrs)
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
    doc: str = "",
) -> OpDef:
    """Declare a two-input elementwise op with NumPy broadcasting."""

    def infer(ctx: InferCtx) -> list[TensorType]:
        dt = ctx.same_dtype(0, 1)
        ctx.require_dtype(0, dtypes)
        shape = broadcast_shapes(name, ctx.type(0).shape, ctx.type(1).shape)
        return [TensorType(out_dtype or dt, shape)]

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        with np.errstate(all="ignore"):
            y = fn(ctx.input(0), ctx.input(1), **ctx.attrs)
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


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics)."""
    if a.dtype.kind in "iu":
        q = np.floor_divide(a, np.where(b == 0, 1, b))
        if a.dtype.kind == "i":
            r = a - q * b
            q = np.where((r != 0) & ((r < 0) != (b < 0)), q + 1, q)
        return q.astype(a.dtype)
    return np.divide(a, b)


binary("add", np.add, commutative=True, doc="A + B")
binary("sub", np.subtract, doc="A - B")
binary("mul", np.multiply, commutative=True, doc="A * B")
binary("div", _int_div, doc="A / B (integers truncate toward zero)")
unary("relu", lambda x: np.maximum(x, np.zeros((), x.dtype)), dtypes=FLOATS | SIGNED_INTS, doc="max(X, 0)")
unary("exp", np.exp)
unary("neg", np.negative, dtypes=FLOATS | SIGNED_INTS)

__all__ = ["ALL", "INTS", "binary", "unary"]

"""``cast``: conversion between element types.

The rules are ONNX's (for the non-float8 types Cuvil has):

* float to float rounds to nearest even; out of range gives +-inf;
* float to integer truncates toward zero; NaN, infinities and out-of-range
  values are undefined in ONNX (the reference gives NumPy's result);
* integer to integer keeps the low bits (two's complement wrap-around);
* anything to bool is ``x != 0`` (NaN is true); bool to a number is 0 or 1.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import ALL, DType
from cuvil.ir.types import TensorType
from cuvil.ops.registry import ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, register


def _cast_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, ALL)
    to = ctx.attrs["to"]
    if not isinstance(to, DType):
        raise ctx.fail(f"attribute 'to' must be an element type, got {to!r}")
    return [TensorType(to, ctx.type(0).shape)]


def cast_array(x: np.ndarray, to: DType) -> np.ndarray:
    """``x`` converted to ``to`` by the rules of this module."""
    with np.errstate(all="ignore"):
        return x.astype(to.np)


def _cast_ref(ctx: RefCtx) -> list[np.ndarray]:
    return [cast_array(ctx.input(0), ctx.attrs["to"])]


register(
    OpDef(
        name="cast",
        inputs=("X",),
        attrs={"to": AttrSpec("dtype")},
        infer=_cast_infer,
        reference=_cast_ref,
        traits=frozenset({ELEMENTWISE}),
        doc="X converted to the element type `to`.",
    )
)

"""Ops every graph relies on: constant and identity."""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

def _constant_infer(ctx: InferCtx) -> list[TensorType]:
    value = ctx.attrs["value"]
    if not isinstance(value, np.ndarray):
        raise ctx.fail("value must be an array")
    return [TensorType(DType.from_np(value.dtype), value.shape)]

register(
    OpDef(
        name="constant",
        inputs=(),
        attrs={"value": AttrSpec("tensor")},
        infer=_constant_infer,
        reference=lambda ctx: [ctx.attrs["value"]],
        doc="A compile-time tensor (weights, folded values).",
    )
)

register(
    OpDef(
        name="identity",
        inputs=("X",),
        infer=lambda ctx: [ctx.type(0)],
        reference=lambda ctx: [ctx.input(0)],
        doc="Returns its input.",
    )
)

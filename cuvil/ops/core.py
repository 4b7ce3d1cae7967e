"""Ops every graph relies on: constant, identity, and full_like (a tensor filled with one value)."""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.ops.registry import SHAPE_ONLY, STORAGE_TYPES, AttrSpec, InferCtx, OpDef, RefCtx, register


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
        traits=frozenset({STORAGE_TYPES}),
        doc="A compile-time tensor (weights, folded values).",
    )
)

register(
    OpDef(
        name="identity",
        inputs=("X",),
        infer=lambda ctx: [ctx.type(0)],
        reference=lambda ctx: [ctx.input(0)],
        traits=frozenset({STORAGE_TYPES}),
        doc="Returns its input.",
    )
)


def _full_like_infer(ctx: InferCtx) -> list[TensorType]:
    value = ctx.attrs["value"]
    if not isinstance(value, np.ndarray) or value.size != 1:
        raise ctx.fail(f"value must be a one-element array, got {value!r}")
    try:
        dtype = DType.from_np(value.dtype)
    except TypeError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(dtype, ctx.type(0).shape)]


def _full_like_ref(ctx: RefCtx) -> list[np.ndarray]:
    value: np.ndarray = ctx.attrs["value"]
    return [np.full(ctx.input(0).shape, value.reshape(()), dtype=value.dtype)]


register(
    OpDef(
        name="full_like",
        inputs=("X",),
        attrs={"value": AttrSpec("tensor")},
        infer=_full_like_infer,
        reference=_full_like_ref,
        traits=frozenset({SHAPE_ONLY}),
        doc="A tensor of X's shape filled with `value` (a one-element array that also gives the element type).",
    )
)

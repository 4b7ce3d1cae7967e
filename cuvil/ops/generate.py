"""Ops that make new tensors from a shape or a few scalars: constant_of_shape, eye_like, range."""

from __future__ import annotations

import numpy as np

from cuvil.ir.assumptions import bounds
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, Dim, ceildiv
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register
from cuvil.ops.shape import int_list, negative, scalar_operand, shape_operand

# constant_of_shape -----------------------------------------------------------


def _fill_value(ctx: InferCtx | RefCtx) -> np.ndarray:
    """The one-element fill value; zero of f32 when the attribute is absent (ONNX's default)."""
    value = ctx.attrs["value"]
    if value is None:
        return np.zeros((), np.float32)
    return np.asarray(value)


def _constant_of_shape_infer(ctx: InferCtx) -> list[TensorType]:
    value = _fill_value(ctx)
    if value.size != 1:
        raise ctx.fail(f"value must hold exactly one element, got shape {list(value.shape)}")
    try:
        dtype = DType.from_np(value.dtype)
    except TypeError as exc:
        raise ctx.fail(f"value: {exc}") from None
    n, dims = shape_operand(ctx, 0, "input (the shape)")
    if dims is None:
        return [TensorType(dtype, (UNKNOWN,) * n)]
    if negative(dims):
        raise ctx.fail(f"shape {list(map(str, dims))} has a negative dim")
    return [TensorType(dtype, tuple(dims))]


def _constant_of_shape_ref(ctx: RefCtx) -> list[np.ndarray]:
    value = _fill_value(ctx)
    return [np.full(int_list(ctx.input(0)), value.reshape(-1)[0], dtype=value.dtype)]


register(
    OpDef(
        name="constant_of_shape",
        inputs=("input",),
        attrs={"value": AttrSpec("tensor", None)},
        infer=_constant_of_shape_infer,
        reference=_constant_of_shape_ref,
        doc="A tensor of shape `input` (i64 vector) filled with the one element of `value` (default f32 0).",
    )
)


# eye_like --------------------------------------------------------------------


def _eye_like_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank != 2:
        raise ctx.fail(f"input must be 2-D, got {t}")
    dtype = ctx.attrs["dtype"]
    if dtype is not None and not isinstance(dtype, DType):
        raise ctx.fail(f"dtype must be an element type, got {dtype!r}")
    return [TensorType(dtype or t.dtype, t.shape)]


def _eye_like_ref(ctx: RefCtx) -> list[np.ndarray]:
    rows, cols = ctx.input(0).shape
    return [np.eye(rows, cols, k=int(ctx.attrs["k"]), dtype=ctx.out_dtype())]


register(
    OpDef(
        name="eye_like",
        inputs=("input",),
        attrs={"dtype": AttrSpec("dtype", None), "k": AttrSpec("int", 0)},
        infer=_eye_like_infer,
        reference=_eye_like_ref,
        doc="Ones on diagonal k of a matrix shaped like the input, zeros elsewhere; dtype defaults to the input's.",
    )
)


# range -----------------------------------------------------------------------

_RANGE_DTYPES = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16, DType.i64, DType.i32, DType.i16})


def _range_len(start: float | int, limit: float | int, delta: float | int) -> int:
    """max(ceil((limit - start) / delta), 0), exactly for integers."""
    if delta == 0:
        raise ValueError("range delta must not be 0")
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        return max(-((start - limit) // delta), 0)
    return max(int(np.ceil((limit - start) / delta)), 0)


def _scalar(a: np.ndarray) -> float | int:
    v = a.reshape(-1)[0]
    return int(v) if a.dtype.kind in "iu" else float(v)


def _stash(ctx: InferCtx | RefCtx, dtype: DType) -> np.dtype:
    """The dtype range computes in: f16/bf16 in stash_type, other floats in f64, integers exactly."""
    if dtype in (DType.f16, DType.bf16):
        stash: DType = ctx.attrs["stash_type"]
        return stash.np
    return np.dtype(np.float64) if dtype.is_float else np.dtype(np.int64)


def _range_infer(ctx: InferCtx) -> list[TensorType]:
    dtype = ctx.same_dtype(0, 1, 2)
    ctx.require_dtype(0, _RANGE_DTYPES)
    if ctx.attrs["stash_type"] not in (DType.f32, DType.f64):
        raise ctx.fail(f"stash_type must be f32 or f64, got {ctx.attrs['stash_type']}")
    for i, what in enumerate(("start", "limit", "delta")):
        scalar_operand(ctx, i, what)
    consts = [ctx.const(i) for i in range(3)]
    n: Dim = UNKNOWN
    if all(c is not None for c in consts):
        stash = _stash(ctx, dtype)
        start, limit, delta = (_scalar(np.asarray(c).astype(stash)) for c in consts if c is not None)
        if delta == 0:
            raise ctx.fail("delta must not be 0")
        n = _range_len(start, limit, delta)
    elif not dtype.is_float:
        n = _symbolic_range_len(ctx)
    return [TensorType(dtype, (n,))]


def _symbolic_range_len(ctx: InferCtx) -> Dim:
    """The length of an integer range whose start or limit is a size computed from shapes
    (``arange(seq)``, ``arange(past, past + seq)``), with a constant step: ``ceil((limit - start) /
    delta)`` where the constraints prove it is never negative; unknown otherwise."""
    ends = [ctx.sym_value(i) for i in range(3)]
    if any(e is None or len(e) != 1 for e in ends):
        return UNKNOWN
    start, limit, delta = (e[0] for e in ends if e is not None)
    if not isinstance(delta, int) or delta == 0:
        return UNKNOWN
    span = limit - start if delta > 0 else start - limit
    if bounds(span, ctx.symbols)[0] < 0:
        return UNKNOWN  # it may be empty: max(..., 0) is not a dim expression
    return ceildiv(span, abs(delta))


def _range_ref(ctx: RefCtx) -> list[np.ndarray]:
    out = ctx.out_dtype()
    stash = _stash(ctx, ctx.out_types[0].dtype)
    start, limit, delta = (_scalar(ctx.input(i).astype(stash)) for i in range(3))
    n = _range_len(start, limit, delta)
    # start + i * delta (not repeated addition), computed in the stash type, then cast
    values = np.asarray(start, stash) + np.arange(n, dtype=stash) * np.asarray(delta, stash)
    return [values.astype(out)]


register(
    OpDef(
        name="range",
        inputs=("start", "limit", "delta"),
        attrs={"stash_type": AttrSpec("dtype", DType.f32)},
        infer=_range_infer,
        reference=_range_ref,
        doc="start + i*delta for i < max(ceil((limit-start)/delta), 0); f16/bf16 compute in stash_type.",
    )
)

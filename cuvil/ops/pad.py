"""The ``pad`` op: constant, reflect, edge and wrap padding, with negative pads cropping.

Follows ONNX Pad-18+ (opset 19 adds ``wrap``): ``pads`` (``[x1_begin, x2_begin, ..., x1_end,
x2_end, ...]``), the optional ``constant_value`` and the optional ``axes`` the pads refer to are
inputs, possibly computed at run time.  A negative pad removes that many elements; cropping is
applied first, then the remaining (positive) pads, so reflect/edge/wrap read the cropped data.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import INTS
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axes, static_ints
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    mode = ctx.attrs["mode"]
    if mode not in PAD_MODES:
        raise ctx.fail(f"mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    ctx.require_dtype(1, INTS)
    pads_t = ctx.type(1)
    if pads_t.rank != 1:
        raise ctx.fail(f"pads must be 1-D, got {pads_t}")
    if ctx.has(2):
        cv = ctx.type(2)
        if cv.dtype != x.dtype:
            raise ctx.fail(f"constant_value has element type {cv.dtype}, the data is {x.dtype}")
        if cv.rank > 1 or (cv.rank == 1 and isinstance(cv.shape[0], int) and cv.shape[0] != 1):
            raise ctx.fail(f"constant_value must be a scalar or hold one element, got {cv}")
    axes: list[int] | None = list(range(x.rank))
    if ctx.has(3):
        ctx.require_dtype(3, INTS)
        raw = static_ints(ctx, 3, "axes")
        axes = None if raw is None else normalize_axes(ctx.op, raw, x.rank)
        if axes is None and ctx.type(3).rank != 1:
            raise ctx.fail(f"axes must be 1-D, got {ctx.type(3)}")
    n_pads = pads_t.shape[0]
    if axes is not None and isinstance(n_pads, int) and n_pads != 2 * len(axes):
        raise ctx.fail(f"pads has {n_pads} values, expected {2 * len(axes)} (begin and end per padded axis)")
    pads = static_ints(ctx, 1, "pads")
    shape: list[Dim] = list(x.shape)
    if pads is None or axes is None:
        # Run-time pads (or axes): every axis they may touch has a run-time extent.
        for a in axes if axes is not None and pads is None else range(x.rank):
            shape[a] = UNKNOWN
        return [TensorType(x.dtype, tuple(shape))]
    k = len(axes)
    for i, a in enumerate(axes):
        size = x.shape[a] + pads[i] + pads[k + i]
        shape[a] = size
        if isinstance(size, int) and size < 0:
            raise ctx.fail(f"pads {pads} crop more than the {x.shape[a]} elements of axis {a}")
        source = x.shape[a]
        if mode != "constant" and isinstance(source, int) and (pads[i] > 0 or pads[k + i] > 0):
            kept = source + min(pads[i], 0) + min(pads[k + i], 0)
            problem = _source_problem(mode, a, kept, max(pads[i], 0), max(pads[k + i], 0))
            if problem:
                raise ctx.fail(problem)
    return [TensorType(x.dtype, tuple(shape))]


def _source_problem(mode: str, axis: int, size: int, before: int, after: int) -> str | None:
    """Non-constant modes read the data: it must be non-empty, and reflect cannot reach past it."""
    if size < 1:
        return f"{mode} padding of axis {axis} needs a non-empty axis"
    if mode == "reflect" and max(before, after) > size - 1:
        return f"reflect padding of axis {axis} by {max(before, after)} exceeds its size {size} minus 1"
    return None


def _pad_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    mode = ctx.attrs["mode"]
    pads = [int(p) for p in ctx.input(1).reshape(-1)]
    axes = list(range(x.ndim))
    if ctx.has(3):
        axes = normalize_axes(ctx.op, [int(a) for a in ctx.input(3).reshape(-1)], x.ndim)
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValueError(f"pad: pads has {len(pads)} values, expected {2 * k}")
    crop = [slice(None)] * x.ndim
    widths = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        b, e = pads[i], pads[k + i]
        crop[a] = slice(-min(b, 0), x.shape[a] + min(e, 0))
        widths[a] = (max(b, 0), max(e, 0))
        if x.shape[a] + min(b, 0) + min(e, 0) < 0:
            raise ValueError(f"pad: pads {pads} crop more than the {x.shape[a]} elements of axis {a}")
    x = x[tuple(crop)]
    if mode == "constant":
        value = ctx.input(2).reshape(-1)[0] if ctx.has(2) else np.zeros((), dtype=x.dtype)
        y = np.pad(x, widths, mode="constant", constant_values=value)
    else:
        for a, (b, e) in enumerate(widths):
            problem = _source_problem(mode, a, x.shape[a], b, e) if b or e else None
            if problem:
                raise ValueError(f"pad: {problem}")
        y = np.pad(x, widths, mode=mode)
    return [y.astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="pad",
        inputs=("data", "pads", "constant_value?", "axes?"),
        attrs={"mode": AttrSpec("str", "constant")},
        infer=_pad_infer,
        reference=_pad_ref,
        doc="Pads (or crops, with negative pads) a tensor (ONNX Pad-19+).",
    )
)

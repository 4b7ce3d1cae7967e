"""``depth_to_space`` and ``space_to_depth``: moving ``blocksize x blocksize`` blocks between the
channel dim and the two spatial dims of a ``[N, C, H, W]`` tensor.

Both take ``mode`` (ONNX DepthToSpace-11 and SpaceToDepth-28): ``DCR`` orders the channel
index as (block row, block column, depth), ``CRD`` as (depth, block row, block column).  Each op
is a reshape, a transpose and a reshape; ``space_to_depth`` is the exact inverse of
``depth_to_space`` in the same mode.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import ALL
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

MODES = ("DCR", "CRD")
_ATTRS = {"blocksize": AttrSpec("int"), "mode": AttrSpec("str", "DCR")}


def _check(ctx: InferCtx) -> tuple[TensorType, int]:
    ctx.require_dtype(0, ALL)
    x = ctx.type(0)
    if x.rank != 4:
        raise ctx.fail(f"input must have rank 4 ([N, C, H, W]), got {x}")
    b = int(ctx.attrs["blocksize"])
    if b < 1:
        raise ctx.fail(f"blocksize must be >= 1, got {b}")
    if ctx.attrs["mode"] not in MODES:
        raise ctx.fail(f"mode {ctx.attrs['mode']!r} is not one of {', '.join(MODES)}")
    return x, b


def _depth_to_space_infer(ctx: InferCtx) -> list[TensorType]:
    x, b = _check(ctx)
    n, c, h, w = x.shape
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"channels {c} are not divisible by blocksize^2 = {b * b}")
    return [TensorType(x.dtype, (n, c // (b * b), h * b, w * b))]


def _depth_to_space_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    b = int(ctx.attrs["blocksize"])
    n, c, h, w = x.shape
    d = c // (b * b)
    if ctx.attrs["mode"] == "DCR":
        y = x.reshape(n, b, b, d, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, d, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [np.ascontiguousarray(y).reshape(n, d, h * b, w * b)]


def _space_to_depth_infer(ctx: InferCtx) -> list[TensorType]:
    x, b = _check(ctx)
    n, c, h, w = x.shape
    for name, dim in (("height", h), ("width", w)):
        if isinstance(dim, int) and dim % b:
            raise ctx.fail(f"{name} {dim} is not divisible by blocksize {b}")
    return [TensorType(x.dtype, (n, c * b * b, h // b, w // b))]


def _space_to_depth_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    b = int(ctx.attrs["blocksize"])
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    perm = (0, 3, 5, 1, 2, 4) if ctx.attrs["mode"] == "DCR" else (0, 1, 3, 5, 2, 4)
    return [np.ascontiguousarray(t.transpose(perm)).reshape(n, c * b * b, h // b, w // b)]


register(
    OpDef(
        name="depth_to_space",
        inputs=("input",),
        attrs=_ATTRS,
        infer=_depth_to_space_infer,
        reference=_depth_to_space_ref,
        doc="Moves channel blocks into spatial blocks (ONNX DepthToSpace).",
    )
)

register(
    OpDef(
        name="space_to_depth",
        inputs=("input",),
        attrs=_ATTRS,
        infer=_space_to_depth_infer,
        reference=_space_to_depth_ref,
        doc="Moves spatial blocks into channel blocks (ONNX SpaceToDepth-28).",
    )
)

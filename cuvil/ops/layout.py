"""Channels-last ops: ``conv_nhwc``, the convolution the ``convert-layout`` pass rewrites ``conv`` into.

``conv_nhwc(X, W, B?)`` is ``conv`` with the channels moved last:

* ``X`` is ``[N, H, W, C]`` (the ``conv`` input transposed by ``[0, 2, 3, 1]``);
* ``W`` is ``[KH, KW, C / group, M]`` (the ``conv`` weight ``[M, C / group, KH, KW]`` transposed
  by ``[2, 3, 1, 0]``): for each kernel tap, the input channels of a group as rows and the output
  channels as contiguous columns, which is the ``[K, M]`` operand of a GEMM as it lies;
* ``B`` is ``[M]``, as for ``conv``;
* the result is ``[N, OH, OW, M]``.

The attributes are ``conv``'s (strides, dilations, pads, auto_pad, group, kernel_shape), read
in the same spatial order (H, then W).  Only 2-D convolutions have a channels-last form.

Inference and the reference are ``conv``'s on the operands transposed back, so the two ops
agree by construction: ``conv_nhwc(x, w, b) == transpose(conv(transpose(x), transpose(w), b))``
bit for bit under the reference interpreter.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from cuvil.ir.types import TensorType
from cuvil.ops import conv as _conv
from cuvil.ops.registry import InferCtx, OpDef, RefCtx, get, register

TO_NHWC = (0, 2, 3, 1)
"""The permutation taking an ``[N, C, H, W]`` tensor to ``[N, H, W, C]``."""
TO_NCHW = (0, 3, 1, 2)
"""Its inverse."""
WEIGHT_TO_HWIO = (2, 3, 1, 0)
"""The permutation taking a ``conv`` weight ``[M, C/group, KH, KW]`` to ``[KH, KW, C/group, M]``."""
WEIGHT_TO_OIHW = (3, 2, 0, 1)
"""Its inverse."""


def permute(t: TensorType, perm: tuple[int, ...]) -> TensorType:
    """``t`` with its dims in the order ``perm`` (the type of ``transpose(x, perm)``)."""
    return t.with_shape(tuple(t.shape[p] for p in perm))


def _conv_nhwc_infer(ctx: InferCtx) -> list[TensorType]:
    x, w = ctx.type(0), ctx.type(1)
    if x.rank != 4:
        raise ctx.fail(f"X must be [N, H, W, C] (2-D convolutions only), got {x}")
    if w.rank != 4:
        raise ctx.fail(f"W must be [KH, KW, C/group, M], got {w}")
    types = [permute(x, TO_NCHW), permute(w, WEIGHT_TO_OIHW), *ctx.types[2:]]
    consts = [None, None, *ctx.consts[2:]]
    (y,) = get("conv").infer(replace(ctx, types=types, consts=consts))
    return [permute(y, TO_NHWC)]


def _conv_nhwc_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0).transpose(TO_NCHW)
    w = ctx.input(1).transpose(WEIGHT_TO_OIHW)
    out_type = permute(ctx.out_types[0], TO_NCHW)
    (y,) = _conv._conv_ref(RefCtx("conv", [x, w, *ctx.inputs[2:]], ctx.attrs, [out_type], ctx.run_region))
    return [np.ascontiguousarray(y.transpose(TO_NHWC))]


register(
    OpDef(
        name="conv_nhwc",
        inputs=("X", "W", "B?"),
        attrs=get("conv").attrs,
        infer=_conv_nhwc_infer,
        reference=_conv_nhwc_ref,
        tolerance=get("conv").tolerance,
        doc="2-D convolution in channels-last layout: X [N, H, W, C], W [KH, KW, C/group, M], Y [N, OH, OW, M].",
    )
)

"""Importers of ONNX normalization ops and the softmax family.

LRN, MeanVarianceNormalization and RMSNormalization are compositions of existing ops (an average
pool over channels; reductions and elementwise arithmetic as ONNX's function bodies write them).

Version differences handled here:

* Softmax, LogSoftmax, Hardmax before opset 13 normalize over every axis from
  ``axis`` (default 1) on, as a 2-D view; the Cuvil op's ``coerce_2d`` does that.
* BatchNormalization is imported in inference mode only.  Before opset 14 the
  mode is given by the number of outputs (opset 7+; ``is_test`` before that),
  from opset 14 by ``training_mode``.  ``spatial=0`` (before opset 9) means
  per-activation parameters ``[C, D1, ..., Dn]``.  ``momentum`` only updates
  running statistics in training, and ``consumed_inputs`` (opset 1) was a
  memory hint; neither affects inference.
* GroupNormalization before opset 21 takes scale and bias per group; they are
  expanded to per channel (opset 21's form) at import time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value


def _softmax_importer(onnx_op: str, cuvil_op: str) -> None:
    @importer(onnx_op)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        known_attrs(ctx, ("axis",))
        if ctx.opset < 13:
            attrs = {"axis": ctx.attr("axis", 1), "coerce_2d": 1}
        else:
            attrs = {"axis": ctx.attr("axis", -1)}
        return ctx.emit(cuvil_op, [ctx.input(0)], attrs)


_softmax_importer("Softmax", "softmax")
_softmax_importer("LogSoftmax", "log_softmax")
_softmax_importer("Hardmax", "hardmax")


@importer("LpNormalization")
def _lp_normalization(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("axis", "p"))
    return ctx.emit("lp_normalization", [ctx.input(0)], dict(ctx.attrs))


@importer("BatchNormalization")
def _batch_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    allowed = ["epsilon", "momentum"]
    if ctx.opset < 9:
        allowed.append("spatial")
    if ctx.opset < 7:
        allowed.append("is_test")
    if ctx.opset < 6:
        allowed.append("consumed_inputs")
    if ctx.opset >= 14:
        allowed.append("training_mode")
    known_attrs(ctx, allowed)
    training = bool(ctx.attr("training_mode", 0)) if ctx.opset >= 14 else ctx.num_outputs > 1
    if training:
        raise ctx.unsupported(
            "training mode (batch statistics and running-statistics outputs); Cuvil compiles inference graphs, "
            "export the model in eval mode"
        )
    x = ctx.input(0)
    params = [ctx.input(i) for i in range(1, 5)]
    if x is None or any(p is None for p in params):
        raise ctx.fail("needs the five inputs X, scale, B, mean, var")
    spatial = ctx.attr("spatial", 1)
    want_rank = 1 if spatial or x.type.rank <= 2 else x.type.rank - 1
    for name, p in zip(("scale", "B", "mean", "var"), params):
        assert p is not None
        if p.type.rank != want_rank:
            raise ctx.fail(f"{name} has rank {p.type.rank}; spatial={spatial} needs rank {want_rank}")
    return ctx.emit("batch_norm", [x, *params], {"epsilon": ctx.attr("epsilon", 1e-5)})


@importer("InstanceNormalization")
def _instance_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("epsilon", "consumed_inputs") if ctx.opset < 6 else ("epsilon",))
    return ctx.emit("instance_norm", ctx.inputs(), {"epsilon": ctx.attr("epsilon", 1e-5)})


@importer("LayerNormalization")
def _layer_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("axis", "epsilon", "stash_type"))
    attrs = {
        "axis": ctx.attr("axis", -1),
        "epsilon": ctx.attr("epsilon", 1e-5),
        "stash_type": dtype_of(ctx.attr("stash_type", 1), "LayerNormalization stash_type"),
    }
    return ctx.emit("layer_norm", ctx.inputs(), attrs, num_outputs=max(ctx.num_outputs, 1))


@importer("GroupNormalization")
def _group_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("epsilon", "num_groups", "stash_type") if ctx.opset >= 21 else ("epsilon", "num_groups"))
    if "num_groups" not in ctx.attrs:
        raise ctx.fail("attribute 'num_groups' is required")
    groups = int(ctx.attrs["num_groups"])
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    if x is None or scale is None or bias is None:
        raise ctx.fail("needs the three inputs X, scale, bias")
    if ctx.opset < 21:
        scale, bias = (_per_channel(ctx, v, name, x, groups) for v, name in ((scale, "scale"), (bias, "bias")))
    attrs = {
        "epsilon": ctx.attr("epsilon", 1e-5),
        "num_groups": groups,
        "stash_type": dtype_of(ctx.attr("stash_type", 1), "GroupNormalization stash_type"),
    }
    return ctx.emit("group_norm", [x, scale, bias], attrs)


def _per_channel(ctx: ImportCtx, v: Value, name: str, x: Value, groups: int) -> Value:
    """Opset-18 per-group scale/bias ``[G]`` as the per-channel ``[C]`` that opset 21 takes."""
    value = ctx.const_input(1 if name == "scale" else 2)
    channels = x.type.shape[1] if x.type.rank >= 2 else None
    if value is None or not isinstance(channels, int):
        raise ctx.unsupported(
            f"GroupNormalization-{ctx.opset} with a {name} computed at run time or a symbolic channel count "
            "(per-group parameters are expanded to per-channel ones at import)"
        )
    if value.shape != (groups,) or channels % groups:
        raise ctx.fail(f"{name} must have shape [{groups}] (one per group) and {groups} must divide {channels}")
    return ctx.constant(np.repeat(value, channels // groups))


@importer("LRN")
def _lrn(ctx: ImportCtx) -> Sequence[Value | None]:
    """``x / (bias + alpha/size * sum of x^2 over a window of `size` channels) ^ beta``.

    The channel window is an average pool (which divides by ``size``, as the formula does) over
    ``x^2`` seen as ``[N, 1, C, D1, ...]``, zero-padded by ``floor((size-1)/2)`` channels before
    and ``ceil((size-1)/2)`` after, the padding counted."""
    known_attrs(ctx, ("alpha", "beta", "bias", "size"))
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("needs its input X")
    if "size" not in ctx.attrs:
        raise ctx.fail("attribute 'size' is required")
    size = int(ctx.attrs["size"])
    if size < 1:
        raise ctx.fail(f"size must be positive, got {size}")
    if x.type.rank < 2:
        raise ctx.fail(f"X must have rank >= 2 ([N, C, ...]), got {x.type}")
    dt = x.type.dtype.np
    spatial = x.type.rank - 1  # the channel axis and the original spatial axes, pooled over
    square = ctx.emit1("mul", [x, x])
    planes = ctx.emit1("unsqueeze", [square, ctx.constant(np.asarray([1], dtype=np.int64))])
    before, after = (size - 1) // 2, size // 2
    pool = {
        "kernel_shape": [size] + [1] * (spatial - 1),
        "pads": [before] + [0] * (spatial - 1) + [after] + [0] * (spatial - 1),
        "count_include_pad": 1,
    }
    mean = ctx.emit1("average_pool", [planes], pool)
    mean = ctx.emit1("squeeze", [mean, ctx.constant(np.asarray([1], dtype=np.int64))])
    scaled = ctx.emit1("mul", [mean, ctx.constant(np.asarray(ctx.attr("alpha", 1e-4), dtype=dt))])
    base = ctx.emit1("add", [scaled, ctx.constant(np.asarray(ctx.attr("bias", 1.0), dtype=dt))])
    denom = ctx.emit1("pow", [base, ctx.constant(np.asarray(ctx.attr("beta", 0.75), dtype=dt))])
    return [ctx.emit1("div", [x, denom])]


def _axes_const(ctx: ImportCtx, axes: Sequence[int]) -> Value:
    return ctx.constant(np.asarray(list(axes), dtype=np.int64))


@importer("MeanVarianceNormalization", since=9)
def _mean_variance_normalization(ctx: ImportCtx) -> Sequence[Value | None]:
    """``(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)`` over ``axes``, as ONNX's function body writes it."""
    known_attrs(ctx, ("axes",))
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("needs its input X")
    axes = _axes_const(ctx, ctx.attr("axes", [0, 2, 3]))
    dt = x.type.dtype.np
    mean = ctx.emit1("reduce_mean", [x, axes])
    mean_of_squares = ctx.emit1("reduce_mean", [ctx.emit1("mul", [x, x]), axes])
    variance = ctx.emit1("sub", [mean_of_squares, ctx.emit1("mul", [mean, mean])])
    std = ctx.emit1("add", [ctx.emit1("sqrt", [variance]), ctx.constant(np.asarray(1e-9, dtype=dt))])
    return [ctx.emit1("div", [ctx.emit1("sub", [x, mean]), std])]


@importer("RMSNormalization", since=23)
def _rms_normalization(ctx: ImportCtx) -> Sequence[Value | None]:
    """``X / sqrt(mean(X^2 over axes axis..) + epsilon) * scale``, computed in ``stash_type`` and cast back
    to X's type before the scale (ONNX's function body)."""
    known_attrs(ctx, ("axis", "epsilon", "stash_type"))
    x, scale = ctx.input(0), ctx.input(1)
    if x is None or scale is None:
        raise ctx.fail("needs the inputs X and scale")
    rank = x.type.rank
    axis = int(ctx.attr("axis", -1))
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for X of rank {rank}")
    stash = dtype_of(ctx.attr("stash_type", 1), "RMSNormalization stash_type")
    if not stash.is_float:
        raise ctx.fail(f"stash_type must be a floating-point type, got {stash}")
    xs = x if x.type.dtype is stash else ctx.emit1("cast", [x], {"to": stash})
    mean_square = ctx.emit1("reduce_mean", [ctx.emit1("mul", [xs, xs]), _axes_const(ctx, range(axis % rank, rank))])
    eps = ctx.constant(np.asarray(ctx.attr("epsilon", 1e-5), dtype=np.float32).astype(stash.np))
    normalized = ctx.emit1("div", [xs, ctx.emit1("sqrt", [ctx.emit1("add", [mean_square, eps])])])
    if normalized.type.dtype is not x.type.dtype:
        normalized = ctx.emit1("cast", [normalized], {"to": x.type.dtype})
    if scale.type.dtype is not x.type.dtype:
        raise ctx.unsupported(f"scale of type {scale.type.dtype} for X of type {x.type.dtype}")
    return [ctx.emit1("mul", [normalized, scale])]

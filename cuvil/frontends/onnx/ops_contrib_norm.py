"""Importers of onnxruntime's fused normalizations: ``SkipLayerNormalization``,
``SimplifiedLayerNormalization`` (RMS norm; onnxruntime registers it in the ONNX domain, it is taken
in ``com.microsoft`` too), ``SkipSimplifiedLayerNormalization`` and ``EmbedLayerNormalization``.

As onnxruntime's CPU kernels compute them:

* Skip*: ``s = input + skip (+ bias)``, where ``skip`` is as ``input`` or broadcasts onto it
  (``[1, seq, hidden]``, ``[seq, hidden]``); gamma, beta and bias are 1-D over the hidden dim; epsilon
  defaults to 1e-12.  Outputs: the normalized ``s``, then ``mean`` and ``inv_std_var`` (float32,
  ``[.., 1]``; the RMS form has no mean and gives zeros, as onnxruntime does), then ``s`` itself.
* ``LayerNormalization`` is ``layer_norm``; the RMS norm is ``x / sqrt(mean(x * x) + eps) * scale``
  over the dims from ``axis`` (epsilon 1e-5 by default for SimplifiedLayerNormalization), computed
  in float32 (float64 for float64 inputs), the result of the scale's element type.
* ``EmbedLayerNormalization``: the rows of ``word_embedding`` at ``input_ids``, plus those of
  ``position_embedding`` at ``position_ids`` (default ``0 .. seq - 1``), plus those of
  ``segment_embedding`` at ``segment_ids`` when both are given, layer-normalized (epsilon 1e-12) with
  gamma and beta.  ``mask_index`` counts the ones in each row of ``mask`` (int32 ``[batch]``; zeros
  without a mask); ``embedding_sum`` is the sum before the normalization.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_contrib import (
    MS,
    bias_vector,
    dim_of,
    float_attr,
    int_attr,
    ints,
    positions,
    required,
    scalar,
)
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

_SKIP_EPSILON = 1e-12
_RMS_EPSILON = 1e-5


def _skip_sum(ctx: ImportCtx, has_beta: bool) -> tuple[Value, Value, Value | None, Value | None]:
    """(input + skip + bias, gamma, beta, bias) of a Skip*Normalization node."""
    x, skip = required(ctx, 0, "input"), required(ctx, 1, "skip")
    if x.type.rank not in (2, 3):
        raise ctx.fail(f"input must be 3-D [batch, seq, hidden] or 2-D [tokens, hidden], got {x.type}")
    tail = x.type.shape[x.type.rank - skip.type.rank:]
    if (skip.type.rank > x.type.rank or skip.type.rank < 2 or any(
            isinstance(a, int) and isinstance(c, int) and a != c and not (a == 1 and i == 2) for i, (a, c) in
            enumerate(zip(skip.type.shape[::-1], tail[::-1])))):
        raise ctx.fail(f"skip {skip.type} must have input's shape {x.type} or broadcast onto it "
                       "([1, seq, hidden] or [seq, hidden])")
    gamma = bias_vector(ctx, 2, "gamma", x)
    beta = bias_vector(ctx, 3, "beta", x) if has_beta and ctx.input(3) is not None else None
    bias_at = 4 if has_beta else 3
    bias = bias_vector(ctx, bias_at, "bias", x) if ctx.input(bias_at) is not None else None
    total = ctx.emit1("add", [x, skip])
    if total.type.shape != x.type.shape:
        raise ctx.fail(f"skip {skip.type} does not broadcast onto input {x.type}")
    if bias is not None:
        total = ctx.emit1("add", [total, bias])
    return total, gamma, beta, bias


def _stash(x: Value) -> DType:
    return DType.f64 if x.type.dtype is DType.f64 else DType.f32


@importer("SkipLayerNormalization", domain=MS)
def _skip_layer_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("epsilon",))
    total, gamma, beta, _ = _skip_sum(ctx, has_beta=True)
    eps = float_attr(ctx, "epsilon", _SKIP_EPSILON)
    stats = min(max(ctx.num_outputs, 1), 3)
    attrs = {"axis": -1, "epsilon": eps, "stash_type": DType.f32}
    outs: list[Value | None] = list(ctx.emit("layer_norm", [total, gamma, beta], attrs, num_outputs=stats))
    outs += [None] * (3 - len(outs))
    return [*outs, total]


def rms_norm(ctx: ImportCtx, x: Value, scale: Value, axis: int, eps: float) -> tuple[Value, Value]:
    """(x / sqrt(mean(x * x) + eps) * scale, the inverse root) over the dims from ``axis``."""
    rank = x.type.rank
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    axis %= rank
    stash = _stash(x)
    xs = x if x.type.dtype is stash else ctx.emit1("cast", [x], {"to": stash})
    mean_square = ctx.emit1("reduce_mean", [ctx.emit1("mul", [xs, xs]), ints(ctx, list(range(axis, rank)))])
    root = ctx.emit1("sqrt", [ctx.emit1("add", [mean_square, scalar(ctx, eps, stash)])])
    inv = ctx.emit1("reciprocal", [root])
    s = scale if scale.type.dtype is stash else ctx.emit1("cast", [scale], {"to": stash})
    y = ctx.emit1("mul", [ctx.emit1("mul", [xs, inv]), s])
    if y.type.shape != x.type.shape:
        raise ctx.fail(f"scale {scale.type} does not broadcast onto the normalized dims of {x.type}")
    if scale.type.dtype is not stash:
        y = ctx.emit1("cast", [y], {"to": scale.type.dtype})
    return y, inv


def _rms_importer(domain: str) -> None:
    @importer("SimplifiedLayerNormalization", domain=domain)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        known_attrs(ctx, ("axis", "epsilon", "stash_type"))
        x, scale = required(ctx, 0, "X"), required(ctx, 1, "scale")
        stash = int_attr(ctx, "stash_type", 1)
        want = 11 if x.type.dtype is DType.f64 else 1
        if stash not in (1, want):
            raise ctx.unsupported(f"stash_type={stash} for a {x.type.dtype} input")
        axis = int_attr(ctx, "axis", -1)
        assert axis is not None
        y, inv = rms_norm(ctx, x, scale, axis, float_attr(ctx, "epsilon", _RMS_EPSILON))
        return [y, inv]


_rms_importer("")
_rms_importer(MS)


@importer("SkipSimplifiedLayerNormalization", domain=MS)
def _skip_simplified_layer_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("epsilon",))
    total, gamma, _, _ = _skip_sum(ctx, has_beta=False)
    if total.type.dtype is DType.f64:
        raise ctx.fail("takes float32, float16 and bfloat16 tensors, got float64")
    if gamma.type.dtype is not total.type.dtype:
        raise ctx.fail(f"gamma {gamma.type} must have the input's element type {total.type.dtype}")
    y, inv = rms_norm(ctx, total, gamma, -1, float_attr(ctx, "epsilon", _SKIP_EPSILON))
    mean = ctx.emit1("full_like", [inv], {"value": np.zeros(1, inv.type.dtype.np)}) if ctx.num_outputs > 1 else None
    return [y, mean, inv, total]


@importer("EmbedLayerNormalization", domain=MS)
def _embed_layer_norm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("epsilon", "mask_index_type"))
    if int_attr(ctx, "mask_index_type", 1) not in (0, 1):
        raise ctx.unsupported(f"mask_index_type={ctx.attrs['mask_index_type']} (0: none, 1: 1-D key lengths)")
    ids = required(ctx, 0, "input_ids")
    words, pos_table = required(ctx, 2, "word_embedding"), required(ctx, 3, "position_embedding")
    seg_ids, seg_table, mask, pos_ids = ctx.input(1), ctx.input(4), ctx.input(7), ctx.input(8)
    for v, name in ((ids, "input_ids"), (seg_ids, "segment_ids"), (mask, "mask"), (pos_ids, "position_ids")):
        if v is not None and (v.type.dtype is not DType.i32 or v.type.rank != 2):
            raise ctx.fail(f"{name} must be int32 [batch, seq], got {v.type}")
    for v, name in ((words, "word_embedding"), (pos_table, "position_embedding"), (seg_table, "segment_embedding")):
        if v is not None and v.type.rank != 2:
            raise ctx.fail(f"{name} must be 2-D [rows, hidden], got {v.type}")
    if (seg_ids is None) != (seg_table is None):
        raise ctx.fail("segment_ids and segment_embedding must be given together")
    total = ctx.emit1("gather", [words, ids], {"axis": 0})
    if pos_ids is None:
        pos_ids = ctx.emit1("unsqueeze", [positions(ctx, dim_of(ctx, ids, 1), DType.i32), ints(ctx, [0])])
    elif pos_ids.type.shape[1] != ids.type.shape[1] and pos_ids.type.shape[0] in (1, ids.type.shape[0]):
        # position_ids is [batch or 1, seq] (onnxruntime checks it): position ids an exporter computes with
        # Range have an unknown length; reshaped to [.., seq], they give the output input_ids' dims
        rows = ints(ctx, [1]) if pos_ids.type.shape[0] == 1 else dim_of(ctx, ids, 0)
        shape = ctx.emit1("concat", [rows, dim_of(ctx, ids, 1)], {"axis": 0})
        pos_ids = ctx.emit1("reshape", [pos_ids, shape])
    total = ctx.emit1("add", [total, ctx.emit1("gather", [pos_table, pos_ids], {"axis": 0})])
    if seg_ids is not None and seg_table is not None:
        total = ctx.emit1("add", [total, ctx.emit1("gather", [seg_table, seg_ids], {"axis": 0})])
    if total.type.rank != 3:
        raise ctx.fail(f"the embeddings' sum {total.type} is not [batch, seq, hidden]")
    attrs = {"axis": -1, "epsilon": float_attr(ctx, "epsilon", _SKIP_EPSILON), "stash_type": DType.f32}
    y = ctx.emit1("layer_norm", [total, bias_vector(ctx, 5, "gamma", total), bias_vector(ctx, 6, "beta", total)],
                  attrs)
    if ctx.num_outputs < 2:
        return [y]
    if mask is not None:
        ones = ctx.emit1("cast", [ctx.emit1("equal", [mask, ctx.constant(1, DType.i32)])], {"to": DType.i32})
        index = ctx.emit1("reduce_sum", [ones, ints(ctx, [1])], {"keepdims": 0})
    else:
        first = ctx.emit1("gather", [ids, ctx.constant(0, DType.i64)], {"axis": 1})
        index = ctx.emit1("full_like", [first], {"value": np.zeros(1, np.int32)})
    return [y, index, total]

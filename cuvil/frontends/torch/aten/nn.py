"""ATen neural-network ops: convolution, normalization, matrix products, pooling.

Normalizations in inference form only: ``_native_batch_norm_legit_no_training``
uses the running statistics; a batch norm in training mode (which would update
its running statistics) is refused with the advice to call ``model.eval()``,
never compiled with training semantics.  Normalizing by the input's own
statistics (instance norm, BatchNorm without running stats) is eager-mode
inference behaviour and is mapped as such.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuvil.frontends.torch.aten.common import (
    cast,
    ints_const,
    mapping,
    optional_value,
    static_size,
    used_results,
)
from cuvil.frontends.torch.converter import TorchCtx
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

# convolution ----------------------------------------------------------------------------------------


def _per_dim(ctx: TorchCtx, name: str, v: Any, n: int) -> list[int]:
    vals = [v] if isinstance(v, int) else list(v)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n or not all(isinstance(x, int) for x in vals):
        raise ctx.fail(f"{name}={v!r} needs {n} static ints (one per spatial dim)")
    return vals


@mapping("aten.convolution.default")
def _convolution(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    w = ctx.value(ctx.arg(1))
    b = optional_value(ctx, ctx.arg(2))
    n = x.type.rank - 2
    if n < 1:
        raise ctx.fail(f"convolution needs an input of rank >= 3, got {x.type}")
    stride = _per_dim(ctx, "stride", ctx.arg(3), n)
    padding = _per_dim(ctx, "padding", ctx.arg(4), n)
    dilation = _per_dim(ctx, "dilation", ctx.arg(5), n)
    transposed = bool(ctx.arg(6))
    output_padding = _per_dim(ctx, "output_padding", ctx.arg(7), n)
    groups = int(ctx.arg(8))
    kernel = [static_size(ctx, ctx.arg(1), 2 + i) for i in range(n)]
    attrs: dict[str, Any] = {"strides": stride, "pads": padding + padding, "dilations": dilation, "group": groups,
                             "kernel_shape": kernel}
    if transposed:
        # PyTorch's transposed weight layout [C_in, C_out / groups, k...] is ConvTranspose's
        if any(output_padding):
            attrs["output_padding"] = output_padding
        return ctx.emit1("conv_transpose", [x, w, b], attrs)
    if any(output_padding):
        raise ctx.fail(f"output_padding={output_padding} is only meaningful for a transposed convolution")
    return ctx.emit1("conv", [x, w, b], attrs)


# normalization ---------------------------------------------------------------------------------------


def _ones_or(ctx: TorchCtx, v: Value | None, channels: int, fill: float, dtype: DType) -> Value:
    return v if v is not None else ctx.constant(np.full((channels,), fill, dtype=dtype.np))


def _batch_norm_eval(ctx: TorchCtx, eps: float) -> list[Value | None]:
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    c = static_size(ctx, x_node, 1)
    dt = x.type.dtype
    scale = _ones_or(ctx, optional_value(ctx, ctx.arg(1)), c, 1.0, dt)
    bias = _ones_or(ctx, optional_value(ctx, ctx.arg(2)), c, 0.0, dt)
    mean = optional_value(ctx, ctx.arg(3))
    var = optional_value(ctx, ctx.arg(4))
    if mean is None or var is None:
        raise _batch_stats(ctx)
    params = [cast(ctx, p, dt) for p in (scale, bias, mean, var)]
    y = ctx.emit1("batch_norm", [x, *params], {"epsilon": float(eps)})
    if used_results(ctx) - {0}:
        raise ctx.fail("the saved mean / inverse std of an inference batch norm are empty tensors; they cannot be used")
    return [y, None, None]


def _batch_stats(ctx: TorchCtx) -> Exception:
    return ctx.fail("batch norm in training mode normalizes with the statistics of the batch and updates its "
                    "running stats; call model.eval() before compiling")


@mapping("aten._native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(ctx: TorchCtx) -> list[Value | None]:
    return _batch_norm_eval(ctx, ctx.arg(6, "eps"))


@mapping("aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit_functional.default")
def _batch_norm_legit(ctx: TorchCtx) -> list[Value | None]:
    # (input, weight, bias, running_mean, running_var, training, momentum, eps)
    if ctx.arg(5, "training"):
        raise _batch_stats(ctx)
    return _batch_norm_eval(ctx, ctx.arg(7, "eps"))


@mapping("aten._native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(ctx: TorchCtx) -> list[Value | None]:
    """Normalization with the statistics of the input itself: what instance norm decomposes to (input
    reshaped to [1, N*C, ...]), and a BatchNorm built with track_running_stats=False, in eval mode too."""
    # (input, weight, bias, training, momentum, eps)
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    c = static_size(ctx, x_node, 1)
    dt = x.type.dtype
    if used_results(ctx) - {0}:
        raise ctx.fail("the saved mean / inverse std of a batch norm are not mapped")
    axes = ints_const(ctx, [0, *range(2, x.type.rank)])
    mean = ctx.emit1("reduce_mean", [x, axes], {"keepdims": 1})
    centered = ctx.emit1("sub", [x, mean])
    var = ctx.emit1("reduce_mean", [ctx.emit1("mul", [centered, centered]), axes], {"keepdims": 1})
    eps = ctx.constant(np.array(float(ctx.arg(5, "eps")), dt.np))
    y = ctx.emit1("div", [centered, ctx.emit1("sqrt", [ctx.emit1("add", [var, eps])])])
    per_channel = ints_const(ctx, [c] + [1] * (x.type.rank - 2))
    w = optional_value(ctx, ctx.arg(1))
    b = optional_value(ctx, ctx.arg(2))
    if w is not None:
        y = ctx.emit1("mul", [y, ctx.emit1("reshape", [cast(ctx, w, dt), per_channel])])
    if b is not None:
        y = ctx.emit1("add", [y, ctx.emit1("reshape", [cast(ctx, b, dt), per_channel])])
    return [y, None, None]


@mapping("aten.native_layer_norm.default")
def _layer_norm(ctx: TorchCtx) -> list[Value | None]:
    x = ctx.value(ctx.arg(0))
    shape = list(ctx.arg(1, "normalized_shape"))
    if not all(isinstance(d, int) for d in shape):
        raise ctx.fail(f"normalized_shape {shape} must be static")
    axis = x.type.rank - len(shape)
    dt = x.type.dtype
    w = optional_value(ctx, ctx.arg(2))
    b = optional_value(ctx, ctx.arg(3))
    if w is None:
        w = ctx.constant(np.ones(shape, dtype=dt.np))
    eps = float(ctx.arg(4, "eps"))
    used = used_results(ctx)
    n_out = max(used) + 1 if used else 1
    outs = ctx.emit("layer_norm", [x, w, b], {"axis": axis, "epsilon": eps, "stash_type": DType.f32},
                    num_outputs=n_out)
    result: list[Value | None] = [outs[0], None, None]
    for i in range(1, n_out):
        if i in used:
            result[i] = cast(ctx, outs[i], ctx.out_type(i).dtype)  # PyTorch's mean / rstd
    return result


@mapping("aten.native_group_norm.default")
def _group_norm(ctx: TorchCtx) -> list[Value | None]:
    # (input, weight, bias, N, C, HxW, group, eps)
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    c = static_size(ctx, x_node, 1)
    dt = x.type.dtype
    scale = _ones_or(ctx, optional_value(ctx, ctx.arg(1)), c, 1.0, dt)
    bias = _ones_or(ctx, optional_value(ctx, ctx.arg(2)), c, 0.0, dt)
    if used_results(ctx) - {0}:
        raise ctx.fail("the mean / rstd results of native_group_norm are not mapped")
    y = ctx.emit1("group_norm", [x, scale, bias], {"num_groups": int(ctx.arg(6)), "epsilon": float(ctx.arg(7))})
    return [y, None, None]


# matrix products ----------------------------------------------------------------------------------------


@mapping("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _matmul(ctx: TorchCtx) -> Value:
    # torch.matmul's broadcasting and 1-D rules are NumPy's, as are Cuvil's matmul's
    return ctx.emit1("matmul", [ctx.value(ctx.arg(0)), ctx.value(ctx.arg(1))])


@mapping("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: TorchCtx) -> Value:
    """``softmax(Q Kᵀ * scale + mask) V`` as the ``attention`` op, with the semantics of torch's own
    decomposition: Q and K each scaled by ``sqrt(scale)``, a bool mask True where a query attends,
    a float mask added, ``is_causal`` aligned top-left, query heads sharing key/value heads with
    ``enable_gqa``, and a query row whose mask hides every key giving zeros."""
    q, k, v = (ctx.value(ctx.arg(i)) for i in range(3))
    mask = optional_value(ctx, ctx.arg(3, "attn_mask"))
    dropout = float(ctx.arg(4, "dropout_p", 0.0))
    causal = bool(ctx.arg(5, "is_causal", False))
    scale = ctx.kwargs.get("scale")
    gqa = bool(ctx.kwargs.get("enable_gqa", False))
    if dropout != 0.0:
        raise ctx.fail(f"dropout_p={dropout} drops attention weights at random; inference needs dropout_p=0 "
                       "(pass dropout_p=self.dropout if self.training else 0.0)")
    rank = q.type.rank
    if rank not in (3, 4) or k.type.rank != rank or v.type.rank != rank:
        raise ctx.fail(f"query, key and value must all be 3-D [batch, seq, dim] or 4-D [batch, heads, seq, dim]; "
                       f"got {q.type}, {k.type}, {v.type}")
    if rank == 4 and not gqa and q.type.shape[1] != k.type.shape[1]:
        raise ctx.fail(f"{q.type.shape[1]} query heads and {k.type.shape[1]} key/value heads need enable_gqa=True")
    if rank == 3:  # one head
        axis = ints_const(ctx, [1])
        q, k, v = (ctx.emit1("unsqueeze", [t, axis]) for t in (q, k, v))
        if mask is not None and mask.type.rank == 3:
            mask = ctx.emit1("unsqueeze", [mask, axis])
    attrs: dict[str, Any] = {"is_causal": int(causal), "guard_masked_rows": 1}
    if scale is not None and float(scale) <= 0.0:
        attrs.update(scale=float(scale), scale_mode="mul")  # sqrt(scale) would not be real
    elif scale is not None:
        attrs.update(scale=float(scale), scale_mode="split")
    y = ctx.emit1("attention", [q, k, v, mask], attrs)
    return ctx.emit1("squeeze", [y, ints_const(ctx, [1])]) if rank == 3 else y


@mapping("aten.linear.default")
def _linear(ctx: TorchCtx) -> Value:
    """``x @ weight.T + bias``: a gemm reading the weight transposed for a 2-D float ``x``, else a
    matmul of the transposed weight (fold-constants makes that the stored weight) and an add."""
    x, w = ctx.value(ctx.arg(0)), ctx.value(ctx.arg(1))
    bias = optional_value(ctx, ctx.arg(2, "bias"))
    if w.type.rank != 2:
        raise ctx.fail(f"the weight has {w.type.rank} dims, not 2")
    if x.type.rank == 2 and x.type.dtype.is_float:
        return ctx.emit1("gemm", [x, w, bias], {"transB": 1})
    y = ctx.emit1("matmul", [x, ctx.emit1("transpose", [w], {"perm": [1, 0]})])
    return y if bias is None else ctx.emit1("add", [y, bias])


@mapping("aten.addmm.default")
def _addmm(ctx: TorchCtx) -> Value:
    bias, a, b = (ctx.value(ctx.arg(i)) for i in range(3))
    beta = ctx.kwargs.get("beta", 1)
    alpha = ctx.kwargs.get("alpha", 1)
    dt = a.type.dtype
    if dt.is_float:
        # beta == 0 ignores the bias entirely (NaN included), as PyTorch does
        return ctx.emit1("gemm", [a, b, None if beta == 0 else bias], {"alpha": float(alpha), "beta": float(beta)})
    y = ctx.emit1("matmul", [a, b])
    if alpha != 1:
        y = ctx.emit1("mul", [y, ctx.constant(np.array(alpha, dt.np))])
    if beta == 0:
        return y
    if beta != 1:
        bias = ctx.emit1("mul", [bias, ctx.constant(np.array(beta, dt.np))])
    return ctx.emit1("add", [y, bias])


# pooling -----------------------------------------------------------------------------------------------


def _window(ctx: TorchCtx, n: int) -> dict[str, Any]:
    kernel = _per_dim(ctx, "kernel_size", ctx.arg(1), n)
    stride_arg = ctx.arg(2, "stride", [])
    stride = kernel if not stride_arg else _per_dim(ctx, "stride", stride_arg, n)
    padding = _per_dim(ctx, "padding", ctx.arg(3, "padding", 0), n)
    return {"kernel_shape": kernel, "strides": stride, "pads": padding + padding}


@mapping("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def _max_pool(ctx: TorchCtx) -> Any:
    x = ctx.value(ctx.arg(0))
    n = x.type.rank - 2
    attrs = _window(ctx, n)
    attrs["dilations"] = _per_dim(ctx, "dilation", ctx.arg(4, "dilation", 1), n)
    attrs["ceil_mode"] = int(bool(ctx.arg(5, "ceil_mode", False)))
    want_indices = 1 in used_results(ctx)
    outs = ctx.emit("max_pool", [x], attrs, num_outputs=2 if want_indices else 1)
    if not want_indices:
        return [outs[0], None]
    # Cuvil's indices count over the whole tensor (N, C, spatial...); PyTorch's within one (n, c) plane
    spatial = [d for d in x.type.shape[2:] if isinstance(d, int)]
    if len(spatial) == n:
        area: Value = ctx.constant(np.array(math.prod(spatial), np.int64))
    else:
        shp = ctx.emit1("slice", [ctx.emit1("shape", [x]), ints_const(ctx, [2]), ints_const(ctx, [x.type.rank])])
        area = ctx.emit1("reduce_prod", [shp], {"keepdims": 0})
    idx = ctx.emit1("mod", [cast(ctx, outs[1], DType.i64), area], {"fmod": 0})
    return [outs[0], idx]


@mapping("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    n = x.type.rank - 2
    attrs = _window(ctx, n)
    attrs["ceil_mode"] = int(bool(ctx.arg(4, "ceil_mode", False)))
    attrs["count_include_pad"] = int(bool(ctx.arg(5, "count_include_pad", True)))
    if ctx.arg(6, "divisor_override") is not None:
        raise ctx.unsupported("avg_pool with divisor_override")
    return ctx.emit1("average_pool", [x], attrs)


@mapping("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(ctx: TorchCtx) -> Value:
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    n = x.type.rank - 2
    out = _per_dim(ctx, "output_size", ctx.arg(1, "output_size"), n)
    if all(o == 1 for o in out):
        return ctx.emit1("reduce_mean", [x, ints_const(ctx, list(range(2, 2 + n)))], {"keepdims": 1})
    sizes = [static_size(ctx, x_node, 2 + i) for i in range(n)]
    if not any(s % o for s, o in zip(sizes, out)):
        kernel = [s // o for s, o in zip(sizes, out)]
        return ctx.emit1("average_pool", [x], {"kernel_shape": kernel, "strides": kernel})
    # Windows of unequal size: output i averages [floor(i*S/O), ceil((i+1)*S/O)).  A rectangle's mean
    # is the mean over one axis of the means over the other, so pool one spatial axis at a time.
    for i, (size, o) in enumerate(zip(sizes, out)):
        axis = 2 + i
        if size == o:
            continue
        pieces = []
        for k in range(o):
            lo, hi = (k * size) // o, -((-(k + 1) * size) // o)
            part = ctx.emit1("slice", [x, ints_const(ctx, [lo]), ints_const(ctx, [hi]), ints_const(ctx, [axis])])
            pieces.append(ctx.emit1("reduce_mean", [part, ints_const(ctx, [axis])], {"keepdims": 1}))
        x = ctx.emit1("concat", pieces, {"axis": axis})
    return x


@mapping("aten.native_dropout.default")
def _dropout(ctx: TorchCtx) -> list[Value | None]:
    if ctx.arg(2, "train") is False:
        return [ctx.value(ctx.arg(0)), None]
    raise ctx.fail("dropout is active (training mode); call model.eval() before compiling")


@mapping("aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec")
def _upsample(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    nearest = "nearest" in ctx.target
    size = ctx.arg(1, "output_size")
    align_corners = False if nearest else bool(ctx.arg(2, "align_corners"))
    scales = ctx.arg(2 if nearest else 3, "scale_factors")
    if nearest:
        # PyTorch's nearest: source = floor(dst * in / out), or floor(dst / scale_factor) when given
        attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        attrs = {"mode": "linear", "coordinate_transformation_mode": "align_corners" if align_corners
                 else "half_pixel"}
    if scales is not None:
        s = ctx.constant(np.array([1.0, 1.0, *[float(v) for v in scales]], np.float32))
        return ctx.emit1("resize", [x, None, s], attrs)
    lead = ctx.emit1("shape", [x], {"start": 0, "end": 2})
    sizes = ctx.emit1("concat", [lead, ctx.ints(list(size))], {"axis": 0})
    return ctx.emit1("resize", [x, None, None, sizes], attrs)

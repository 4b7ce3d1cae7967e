"""ATen reductions: mean/sum/prod, amax/amin, max/min with indices, argmax, any/all, var, softmax, cumsum.

PyTorch's ``dim`` lists follow one rule here: ``None`` or an empty list
reduces every dim.  Sums and products of integers and booleans accumulate in
int64 as in eager mode (the result type torch.export recorded).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuvil.frontends.torch.aten.common import axis_of, cast, ints_const, mapping, tensor_dtype_arg
from cuvil.frontends.torch.converter import TorchCtx
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value


def _axes(ctx: TorchCtx, dims: Any, rank: int) -> list[int]:
    """The reduced axes; ``None`` or ``[]`` mean all of them."""
    if dims is None:
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    out = sorted({axis_of(ctx, int(d), rank) for d in dims})
    return out or list(range(rank))


def reduce(ctx: TorchCtx, op: str, x: Value, axes: list[int], keepdim: bool) -> Value:
    if x.type.rank == 0:
        return x
    return ctx.emit1(op, [x, ints_const(ctx, axes)], {"keepdims": int(bool(keepdim))})


def _reduce_mapping(op: str, dim_pos: int | None) -> Any:
    def fn(ctx: TorchCtx) -> Value:
        x = ctx.value(ctx.arg(0))
        out = ctx.out_type().dtype
        dims = ctx.arg(1, "dim") if dim_pos is not None else None
        keepdim = bool(ctx.arg(2, "keepdim", False)) if dim_pos is not None else False
        return reduce(ctx, op, cast(ctx, x, out), _axes(ctx, dims, x.type.rank), keepdim)

    return fn


mapping("aten.mean.dim")(_reduce_mapping("reduce_mean", 1))
mapping("aten.mean.default")(_reduce_mapping("reduce_mean", None))
mapping("aten.sum.dim_IntList")(_reduce_mapping("reduce_sum", 1))
mapping("aten.prod.dim_int")(_reduce_mapping("reduce_prod", 1))
mapping("aten.prod.default")(_reduce_mapping("reduce_prod", None))
mapping("aten.amax.default")(_reduce_mapping("reduce_max", 1))
mapping("aten.amin.default")(_reduce_mapping("reduce_min", 1))


@mapping("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(ctx: TorchCtx) -> Value:
    x = cast(ctx, ctx.value(ctx.arg(0)), DType.bool)
    dims = None if ctx.target.endswith(".default") else ctx.arg(1, "dim")
    keepdim = bool(ctx.arg(2, "keepdim", False))
    return reduce(ctx, "reduce_max", x, _axes(ctx, dims, x.type.rank), keepdim)


@mapping("aten.max.dim", "aten.min.dim")
def _max_min_dim(ctx: TorchCtx) -> list[Value]:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    is_max = ".max." in ctx.target
    values = reduce(ctx, "reduce_max" if is_max else "reduce_min", x, [dim], bool(keep))
    # PyTorch's CPU kernels give the first index of the extreme value
    idx = ctx.emit1("arg_max" if is_max else "arg_min", [x], {"axis": dim, "keepdims": keep})
    return [values, idx]


@mapping("aten.max.default", "aten.min.default")
def _max_min_all(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    return reduce(ctx, "reduce_max" if ".max." in ctx.target else "reduce_min", x, list(range(x.type.rank)), False)


@mapping("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = ctx.arg(1, "dim")
    keep = int(bool(ctx.arg(2, "keepdim", False)))
    op = "arg_max" if "argmax" in ctx.target else "arg_min"
    if dim is None:
        flat = ctx.emit1("reshape", [x, ints_const(ctx, [-1])])
        y = ctx.emit1(op, [flat], {"axis": 0, "keepdims": 0})
        if keep:
            y = ctx.emit1("reshape", [y, ints_const(ctx, [1] * x.type.rank)])
        return y
    return ctx.emit1(op, [x], {"axis": axis_of(ctx, int(dim), x.type.rank), "keepdims": keep})


def _count(ctx: TorchCtx, x: Value, axes: list[int]) -> Value:
    """The number of elements reduced over ``axes``, as a 0-d tensor of ``x``'s float type."""
    dims = [x.type.shape[a] for a in axes]
    static = [d for d in dims if isinstance(d, int)]
    if len(static) == len(dims):
        return ctx.constant(np.array(math.prod(static), x.type.dtype.np))
    sizes = [ctx.emit1("shape", [x], {"start": a, "end": a + 1}) for a in axes]
    n = sizes[0] if len(sizes) == 1 else ctx.emit1("concat", sizes, {"axis": 0})
    total = ctx.emit1("reduce_prod", [n], {"keepdims": 0})
    return cast(ctx, total, x.type.dtype)


def _variance(ctx: TorchCtx) -> tuple[Value, Value]:
    x = ctx.value(ctx.arg(0))
    if not x.type.dtype.is_float:
        raise ctx.fail(f"var of a {x.type.dtype} tensor: PyTorch computes it for floating types only")
    axes = _axes(ctx, ctx.arg(1, "dim"), x.type.rank)
    correction = ctx.kwargs.get("correction")
    correction = 1 if correction is None else correction
    keepdim = bool(ctx.kwargs.get("keepdim", False))
    mean = reduce(ctx, "reduce_mean", x, axes, True)
    diff = ctx.emit1("sub", [x, mean])
    ssq = reduce(ctx, "reduce_sum", ctx.emit1("mul", [diff, diff]), axes, keepdim)
    n = _count(ctx, x, axes)
    denom = ctx.emit1("sub", [n, ctx.constant(np.array(correction, x.type.dtype.np))])
    denom = ctx.emit1("max", [denom, ctx.constant(np.array(0, x.type.dtype.np))])  # N <= correction gives inf/nan
    var = ctx.emit1("div", [ssq, denom])
    if not keepdim:
        mean = ctx.emit1("squeeze", [mean, ints_const(ctx, axes)]) if axes and x.type.rank else mean
    return var, mean


@mapping("aten.var.correction")
def _var(ctx: TorchCtx) -> Value:
    return _variance(ctx)[0]


@mapping("aten.var_mean.correction")
def _var_mean(ctx: TorchCtx) -> list[Value]:
    var, mean = _variance(ctx)
    return [var, mean]


@mapping("aten._softmax.default", "aten._log_softmax.default")
def _softmax(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    x = cast(ctx, x, ctx.out_type().dtype)  # half_to_float / dtype= compute in the result type
    op = "log_softmax" if "log_softmax" in ctx.target else "softmax"
    if x.type.rank == 0:
        zero_or_one = 0.0 if op == "log_softmax" else 1.0
        return ctx.emit1("full_like", [x], {"value": np.array(zero_or_one, x.type.dtype.np)})
    return ctx.emit1(op, [x], {"axis": dim})


@mapping("aten.cumsum.default")
def _cumsum(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    dt = tensor_dtype_arg(ctx, "dtype") or ctx.out_type().dtype
    x = cast(ctx, x, dt)
    if x.type.rank == 0:
        return x
    return ctx.emit1("cumsum", [x, ctx.constant(np.array(dim, np.int64))])


@mapping("aten.linalg_vector_norm.default")
def _vector_norm(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    order = float(ctx.arg(1, "ord", 2))
    axes = _axes(ctx, ctx.arg(2, "dim"), x.type.rank)
    keepdim = bool(ctx.arg(3, "keepdim", False))
    x = cast(ctx, x, ctx.out_type().dtype)
    if order == 2:
        return reduce(ctx, "reduce_l2", x, axes, keepdim)
    if order == 1:
        return reduce(ctx, "reduce_l1", x, axes, keepdim)
    mag = ctx.emit1("abs", [x])
    if order in (float("inf"), float("-inf")):
        return reduce(ctx, "reduce_max" if order > 0 else "reduce_min", mag, axes, keepdim)
    if order == 0:
        nonzero = cast(ctx, ctx.emit1("not", [cast(ctx, ctx.emit1("equal", [mag, ctx.constant(
            np.array(0, x.type.dtype.np))]), DType.bool)]), x.type.dtype)
        return reduce(ctx, "reduce_sum", nonzero, axes, keepdim)
    p = ctx.constant(np.array(order, x.type.dtype.np))
    total = reduce(ctx, "reduce_sum", ctx.emit1("pow", [mag, p]), axes, keepdim)
    return ctx.emit1("pow", [total, ctx.constant(np.array(1.0 / order, x.type.dtype.np))])

"""Reductions: ``reduce_*`` over a set of axes, ``arg_max``/``arg_min``, ``cumsum``/``cumprod`` and ``top_k``.

The ``reduce_*`` ops follow ONNX opset 18+: the axes are an optional second
input (a 1-D int64 tensor, possibly computed at run time), ``keepdims`` keeps
reduced axes as size 1, and ``noop_with_empty_axes`` says whether an absent or
empty axes list reduces over every axis (0) or over none (1).  Reducing an
empty set of values gives the reduction's identity (0 for sums, 1 for
products, -inf/+inf or the integer limits for max/min, -inf for the log-sums).

Half-precision floats (f16, bf16) are accumulated in float32 and rounded once
at the end, the way numerically careful runtimes do it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.ir.dtypes import ALL, FLOATS, NUMERIC, DType
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axes, normalize_axis, static_ints
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

_HALF = (np.dtype(np.float16), DType.bf16.np)


def _acc_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a reduction accumulates in: float32 for half floats, else the input's own."""
    return np.dtype(np.float32) if dt in _HALF else dt


# reduce_* ------------------------------------------------------------------

Axes = tuple[int, ...]
ReduceFn = Callable[[np.ndarray, Axes, bool], np.ndarray]


def _sum(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.asarray(np.sum(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype)))


def _mean(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    total = _sum(x, axes, keep)
    if x.dtype.kind in "iu":
        # Integer mean truncates toward zero (the quotient of an integer division); an empty set gives 0.
        q = np.abs(total) // max(count, 1)
        return np.asarray(np.where(total < 0, -q, q)).astype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(total / np.asarray(count, total.dtype))


def _prod(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.asarray(np.prod(x, axis=axes, keepdims=keep, dtype=_acc_dtype(x.dtype)))


def _extreme(x: np.ndarray, largest: bool) -> int | float:
    """The identity of max (``largest``) or min for the dtype of ``x``."""
    if x.dtype == np.bool_:
        return not largest
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        return info.min if largest else info.max
    return -np.inf if largest else np.inf


def _max(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.asarray(np.max(x, axis=axes, keepdims=keep, initial=_extreme(x, True)))


def _min(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return np.asarray(np.min(x, axis=axes, keepdims=keep, initial=_extreme(x, False)))


def _l1(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    return _sum(np.abs(x), axes, keep)


def _sum_square(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    xa = x.astype(_acc_dtype(x.dtype))
    return _sum(xa * xa, axes, keep)


def _l2(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    s = _sum_square(x, axes, keep)
    if x.dtype.kind in "iu":  # an integer norm truncates, like a cast of the float result
        return np.asarray(np.floor(np.sqrt(s.astype(np.float64))))
    return np.asarray(np.sqrt(s))


def _log_sum(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(_sum(x, axes, keep)))


def _log_sum_exp(x: np.ndarray, axes: Axes, keep: bool) -> np.ndarray:
    xa = x.astype(_acc_dtype(x.dtype))
    # Shift by the largest finite value so exp cannot overflow; infinities pass through exp unchanged.
    finite = np.where(np.isfinite(xa), xa, -np.inf)
    shift = np.max(finite, axis=axes, keepdims=True, initial=-np.inf)
    shift = np.where(np.isfinite(shift), shift, 0).astype(xa.dtype)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.sum(np.exp(xa - shift), axis=axes, keepdims=True)
        out = np.log(s) + shift
    if not keep:
        out = np.squeeze(out, axis=axes)
    return np.asarray(out)


def reduce_axes(ctx: InferCtx | RefCtx, rank: int, axes: list[int] | None) -> tuple[int, ...] | None:
    """The axes a reduction covers, given the listed ``axes`` (None: not listed at all).

    An empty or absent list means every axis, or no axis when ``noop_with_empty_axes`` is set."""
    if not axes:
        return () if ctx.attrs["noop_with_empty_axes"] else tuple(range(rank))
    return tuple(sorted(normalize_axes(ctx.op, axes, rank)))


def _check_axes_input(ctx: InferCtx) -> None:
    if ctx.has(1):
        ctx.require_dtype(1, {DType.i64, DType.i32})
        if ctx.type(1).rank != 1:
            raise ctx.fail(f"axes must be a 1-D tensor, got rank {ctx.type(1).rank}")


def _reduce_infer(dtypes: frozenset[DType]) -> Callable[[InferCtx], list[TensorType]]:
    def infer(ctx: InferCtx) -> list[TensorType]:
        ctx.require_dtype(0, dtypes)
        t = ctx.type(0)
        keep = bool(ctx.attrs["keepdims"])
        _check_axes_input(ctx)
        listed = static_ints(ctx, 1, "axes") if ctx.has(1) else []
        if listed is None and ctx.type(1).shape[0] == 0:
            listed = []  # a run-time tensor known to be empty lists no axis
        if listed is not None:
            axes = reduce_axes(ctx, t.rank, listed)
            assert axes is not None
            if keep:
                shape = [1 if i in axes else d for i, d in enumerate(t.shape)]
            else:
                shape = [d for i, d in enumerate(t.shape) if i not in axes]
            return [TensorType(t.dtype, tuple(shape))]
        # Axes computed at run time: each dim is either kept or reduced, so only size-1 dims are known.
        n_axes = ctx.type(1).shape[0]
        if keep:
            return [TensorType(t.dtype, tuple(1 if d == 1 else UNKNOWN for d in t.shape))]
        if not isinstance(n_axes, int):
            raise ctx.fail("with keepdims=0 the axes must be a constant or have a static length; "
                           "otherwise the output rank is unknown")
        if n_axes > t.rank:
            raise ctx.fail(f"{n_axes} axes given for an input of rank {t.rank}")
        # Axes are distinct, so n of them remove n dims; which ones is known only at run time.
        return [TensorType(t.dtype, tuple(UNKNOWN for _ in range(t.rank - n_axes)))]

    return infer


def _reduce_ref(fn: ReduceFn) -> Callable[[RefCtx], list[np.ndarray]]:
    def ref(ctx: RefCtx) -> list[np.ndarray]:
        x = ctx.input(0)
        listed = [int(a) for a in ctx.input(1).reshape(-1)] if ctx.has(1) else []
        axes = reduce_axes(ctx, x.ndim, listed)
        assert axes is not None
        y = fn(x, axes, bool(ctx.attrs["keepdims"]))
        return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]

    return ref


_REDUCE_ATTRS = {"keepdims": AttrSpec("int", 1), "noop_with_empty_axes": AttrSpec("int", 0)}


def _reduce(name: str, fn: ReduceFn, dtypes: frozenset[DType], doc: str) -> OpDef:
    return register(
        OpDef(
            name=name,
            inputs=("data", "axes?"),
            outputs=("reduced",),
            attrs=_REDUCE_ATTRS,
            infer=_reduce_infer(dtypes),
            reference=_reduce_ref(fn),
            doc=doc,
        )
    )


_reduce("reduce_sum", _sum, NUMERIC, "Sum over axes; empty set gives 0.")
_reduce("reduce_mean", _mean, NUMERIC, "Mean over axes (integers truncate toward zero); empty set gives NaN.")
_reduce("reduce_prod", _prod, NUMERIC, "Product over axes; empty set gives 1.")
_reduce("reduce_max", _max, ALL, "Maximum over axes (False < True); empty set gives -inf or the type's minimum.")
_reduce("reduce_min", _min, ALL, "Minimum over axes; empty set gives +inf or the type's maximum.")
_reduce("reduce_l1", _l1, NUMERIC, "Sum of absolute values over axes.")
_reduce("reduce_l2", _l2, NUMERIC, "Square root of the sum of squares over axes.")
_reduce("reduce_sum_square", _sum_square, NUMERIC, "Sum of squares over axes.")
_reduce("reduce_log_sum", _log_sum, FLOATS, "log(sum(x)) over axes; empty set gives -inf.")
_reduce("reduce_log_sum_exp", _log_sum_exp, FLOATS, "log(sum(exp(x))) over axes, computed stably; empty gives -inf.")


# arg_max / arg_min ---------------------------------------------------------


def _arg_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, NUMERIC | {DType.bool})
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], t.rank)
    if t.shape[axis] == 0:
        raise ctx.fail(f"axis {axis} has size 0: there is no element to select")
    if ctx.attrs["keepdims"]:
        shape = tuple(1 if i == axis else d for i, d in enumerate(t.shape))
    else:
        shape = tuple(d for i, d in enumerate(t.shape) if i != axis)
    return [TensorType(DType.i64, shape)]


def _arg_ref(pick: Callable[..., np.ndarray]) -> Callable[[RefCtx], list[np.ndarray]]:
    def ref(ctx: RefCtx) -> list[np.ndarray]:
        x = ctx.input(0)
        axis = normalize_axis(ctx.op, ctx.attrs["axis"], x.ndim)
        if x.dtype in _HALF:
            x = x.astype(np.float32)  # exact: only the order matters
        if ctx.attrs["select_last_index"]:
            # The first hit in the reversed axis is the last one in the original order.
            idx = x.shape[axis] - 1 - pick(np.flip(x, axis=axis), axis=axis)
        else:
            idx = pick(x, axis=axis)
        if ctx.attrs["keepdims"]:
            idx = np.expand_dims(idx, axis)
        return [np.asarray(idx, dtype=np.int64)]

    return ref


_ARG_ATTRS = {"axis": AttrSpec("int", 0), "keepdims": AttrSpec("int", 1), "select_last_index": AttrSpec("int", 0)}
for _name, _pick in (("arg_max", np.argmax), ("arg_min", np.argmin)):
    register(
        OpDef(
            name=_name,
            inputs=("data",),
            outputs=("reduced",),
            attrs=_ARG_ATTRS,
            infer=_arg_infer,
            reference=_arg_ref(_pick),
            doc=f"Index (int64) of the {'largest' if _name == 'arg_max' else 'smallest'} element along axis; "
            "ties go to the first index, or the last with select_last_index=1.",
        )
    )


# cumsum, cumprod -------------------------------------------------------------


def _scalar_axis_input(ctx: InferCtx, i: int, what: str) -> int | None:
    """Validate a scalar (0-D or one-element 1-D) integer input; its value when constant."""
    ctx.require_dtype(i, {DType.i64, DType.i32})
    t = ctx.type(i)
    if t.rank > 1 or (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] != 1):
        raise ctx.fail(f"{what} must be a scalar or a one-element 1-D tensor, got {t}")
    values = static_ints(ctx, i, what)
    if values is None:
        return None
    if len(values) != 1:
        raise ctx.fail(f"{what} must hold exactly one value, got {values}")
    return values[0]


def _cumsum_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, NUMERIC)
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    axis = _scalar_axis_input(ctx, 1, "axis")
    if axis is not None:
        normalize_axis(ctx.op, axis, t.rank)
    return [t]


def _cumulative_ref(scan: Callable[..., np.ndarray], identity: int) -> Callable[[RefCtx], list[np.ndarray]]:
    """The reference of a cumulative op: ``scan`` (np.cumsum, np.cumprod) along the axis; ``exclusive``
    shifts the result by one, ``identity`` first."""

    def ref(ctx: RefCtx) -> list[np.ndarray]:
        x = ctx.input(0)
        axis = normalize_axis(ctx.op, int(ctx.input(1).reshape(-1)[0]), x.ndim)
        xa = x.astype(_acc_dtype(x.dtype), copy=False)
        if ctx.attrs["reverse"]:
            xa = np.flip(xa, axis=axis)
        with np.errstate(all="ignore"):  # integers wrap around, as the kernels' do
            y = scan(xa, axis=axis, dtype=xa.dtype)
        if ctx.attrs["exclusive"]:
            # Shift by one along the axis: element i gets the combination of the elements before it.
            shifted = np.full_like(y, identity)
            dst = [slice(None)] * x.ndim
            src = [slice(None)] * x.ndim
            dst[axis], src[axis] = slice(1, None), slice(None, -1)
            shifted[tuple(dst)] = y[tuple(src)]
            y = shifted
        if ctx.attrs["reverse"]:
            y = np.flip(y, axis=axis)
        return [np.asarray(y, order="C").astype(ctx.out_dtype(), copy=False)]

    return ref


for _name, _scan, _identity, _what in (("cumsum", np.cumsum, 0, "sum"), ("cumprod", np.cumprod, 1, "product")):
    register(
        OpDef(
            name=_name,
            inputs=("x", "axis"),
            outputs=("y",),
            attrs={"exclusive": AttrSpec("int", 0), "reverse": AttrSpec("int", 0)},
            infer=_cumsum_infer,
            reference=_cumulative_ref(_scan, _identity),
            doc=f"Cumulative {_what} along a (scalar, possibly run-time) axis; exclusive and reverse variants.",
        )
    )


# top_k -------------------------------------------------------------------------


def _top_k_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, NUMERIC)
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], t.rank)
    k = _scalar_axis_input(ctx, 1, "K")
    if ctx.type(1).dtype is not DType.i64:
        raise ctx.fail(f"K must be int64, got {ctx.type(1).dtype}")
    n = t.shape[axis]
    kdim: Dim = UNKNOWN
    if k is not None:
        if k < 0:
            raise ctx.fail(f"K must be non-negative, got {k}")
        if isinstance(n, int) and k > n:
            raise ctx.fail(f"K={k} exceeds the size {n} of axis {axis}")
        kdim = k
    shape = tuple(kdim if i == axis else d for i, d in enumerate(t.shape))
    return [TensorType(t.dtype, shape), TensorType(DType.i64, shape)]


def _top_k_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], x.ndim)
    k = int(ctx.input(1).reshape(-1)[0])
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"top_k: K={k} is outside [0, {n}] for axis {axis}")
    keys = x.astype(np.float32) if x.dtype in _HALF else x
    if ctx.attrs["largest"]:
        # Sort the reversed axis ascending (stable), then reverse: values descend and, among
        # equal values, the lower original index comes first.
        order = np.flip(np.argsort(np.flip(keys, axis=axis), axis=axis, kind="stable"), axis=axis)
        order = n - 1 - order
    else:
        order = np.argsort(keys, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=axis), idx]


register(
    OpDef(
        name="top_k",
        inputs=("X", "K"),
        outputs=("Values", "Indices"),
        attrs={"axis": AttrSpec("int", -1), "largest": AttrSpec("int", 1), "sorted": AttrSpec("int", 1)},
        infer=_top_k_infer,
        reference=_top_k_ref,
        doc="The K largest (or smallest) elements along axis and their int64 indices; ties go to the lower "
        "index. Results are always sorted (sorted=0 leaves the order unspecified, so sorted order is valid).",
    )
)

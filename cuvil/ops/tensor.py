"""Ops that cut, join and repeat tensors: concat, split, slice, tile, trilu.

Their shape inference works on symbolic dims: ``concat`` along a symbolic
axis sums the dims, ``split`` into equal parts divides one, and ``slice``
resolves its bounds against a symbolic dim when the result is provable
(see :func:`_slice_len`); what cannot be known becomes ``UNKNOWN``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, Dim, ceildiv, is_unknown, sym
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axes, normalize_axis, static_ints
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register
from cuvil.ops.shape import (
    INDEX_DTYPES,
    concrete,
    int_list,
    negative,
    operand_length,
    scalar_operand,
    shape_operand,
    static_operand,
)

# concat --------------------------------------------------------------------


def _concat_infer(ctx: InferCtx) -> list[TensorType]:
    n = len(ctx.types)
    if n == 0:
        raise ctx.fail("needs at least one input")
    dtype = ctx.same_dtype(*range(n))
    types = [ctx.type(i) for i in range(n)]
    rank = types[0].rank
    if rank == 0:
        raise ctx.fail("cannot concatenate scalars (rank 0)")
    if any(t.rank != rank for t in types):
        raise ctx.fail(f"inputs must share one rank, got {[str(t) for t in types]}")
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), rank)
    out: list[Dim] = list(types[0].shape)
    out[axis] = 0
    for t in types:
        for i, d in enumerate(t.shape):
            if i == axis:
                out[i] = out[i] + d
            elif isinstance(out[i], int) and isinstance(d, int):
                if out[i] != d:
                    raise ctx.fail(f"inputs differ in dim {i} (not the concat axis): {[str(x) for x in types]}")
            else:
                ctx.assume_equal(out[i], d, f"dim {i} of the inputs (not the concat axis)")
                if isinstance(d, int) or is_unknown(out[i]):
                    out[i] = d  # a static dim (or any dim over an unknown one) says more
    return [TensorType(dtype, tuple(out))]


def _concat_ref(ctx: RefCtx) -> list[np.ndarray]:
    xs = [ctx.input(i) for i in range(len(ctx.inputs))]
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), xs[0].ndim)
    return [np.concatenate(xs, axis=axis)]


register(
    OpDef(
        name="concat",
        inputs=("inputs*",),
        outputs=("concat_result",),
        attrs={"axis": AttrSpec("int")},
        infer=_concat_infer,
        reference=_concat_ref,
        doc="Join tensors of one rank along `axis`; the other dims must match.",
    )
)


# split ---------------------------------------------------------------------


def _equal_parts(dim: Dim, parts: int, fail: Callable[[str], Exception]) -> list[Dim]:
    """ONNX Split's equal parts: ceil(dim / parts) each, the last one smaller."""
    if parts < 1:
        raise fail(f"cannot split into {parts} parts")
    chunk = ceildiv(dim, parts)
    last = dim - chunk * (parts - 1)
    if isinstance(last, int) and last < 0:
        raise fail(f"cannot split a dim of {dim} into {parts} parts of ceil({dim}/{parts}) = {chunk}")
    return [chunk] * (parts - 1) + [last]


def _split_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("cannot split a scalar")
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), t.rank)
    d = t.shape[axis]
    k = ctx.num_outputs
    num = ctx.attrs["num_outputs"]
    sizes: Sequence[Dim]
    if ctx.has(1):
        if num is not None:
            raise ctx.fail("takes either the split input or the num_outputs attribute, not both")
        n, values = static_operand(ctx, 1, "split")
        if n != k:
            raise ctx.fail(f"split lists {n} sizes but the node has {k} outputs")
        if values is None:
            sizes = [UNKNOWN] * k
        else:
            if any(v < 0 for v in values):
                raise ctx.fail(f"split sizes {values} must not be negative")
            if isinstance(d, int) and sum(values) != d:
                raise ctx.fail(f"split sizes {values} add up to {sum(values)}, not to dim {axis} of {t}")
            sizes = values
    else:
        if num is None:
            raise ctx.fail("needs the split input or the num_outputs attribute")
        if int(num) != k:
            raise ctx.fail(f"num_outputs is {num} but the node has {k} outputs")
        sizes = _equal_parts(d, k, ctx.fail)
    return [TensorType(t.dtype, (*t.shape[:axis], s, *t.shape[axis + 1 :])) for s in sizes]


def _split_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), x.ndim)
    if ctx.has(1):
        sizes = int_list(ctx.input(1))
        if sum(sizes) != x.shape[axis] or any(s < 0 for s in sizes):
            raise ValueError(f"split sizes {sizes} do not partition dim {axis} of shape {list(x.shape)}")
    else:
        sizes = concrete(_equal_parts(x.shape[axis], len(ctx.out_types), ValueError))
    bounds = np.cumsum([0, *sizes])
    index: list[slice] = [slice(None)] * x.ndim
    outs = []
    for lo, hi in itertools.pairwise(bounds):
        index[axis] = slice(int(lo), int(hi))
        outs.append(np.asarray(x[tuple(index)], order="C"))
    return outs


register(
    OpDef(
        name="split",
        inputs=("input", "split?"),
        outputs=("outputs*",),
        attrs={"axis": AttrSpec("int", 0), "num_outputs": AttrSpec("int", None)},
        infer=_split_infer,
        reference=_split_ref,
        doc="Cut along `axis` into the sizes of `split`, or into num_outputs parts of ceil(dim/n) (last smaller).",
    )
)


# slice ---------------------------------------------------------------------

# An end (or start) at or beyond this bound means "to the end of the axis".
# It is ONNX's documented INT_MAX convention; no single axis is assumed to hold
# 2**31 - 1 elements or more.
_HUGE = 2**31 - 1


def _lower_bound(ctx: InferCtx, x: Dim) -> int | None:
    """A proven lower bound of dim expression ``x``, or None.

    Handles ``s + c`` for one symbol ``s`` (at least its declared minimum,
    else 0, since a dim is never negative)."""
    if isinstance(x, int):
        return x
    if is_unknown(x):
        return None
    names = x.symbols()
    if len(names) != 1:
        return None
    (name,) = names
    c = x - sym(name)
    if not isinstance(c, int):
        return None
    info = ctx.symbols.get(name)
    lo = info.min if info is not None and info.min is not None else 0
    return max(lo, 0) + c


def _slice_len(ctx: InferCtx, d: Dim, start: int, end: int, step: int) -> Dim:
    """The length of ``range(start, end, step)`` clamped to a dim of size ``d`` (ONNX Slice rules)."""
    if isinstance(d, int):
        return len(range(*slice(start, end, step).indices(d)))

    def at_least(x: Dim, k: int) -> bool:
        lb = _lower_bound(ctx, x)
        return lb is not None and lb >= k

    def bound(v: int, forward: bool) -> Dim:
        """``v`` resolved against ``d`` and clamped, when that is provable without knowing ``d``."""
        if v >= _HUGE:
            return d if forward else d - 1
        if v <= -_HUGE:
            return 0 if forward else -1
        # forward bounds clamp to [0, d]; backward ones to [-1, d - 1]
        slack = 0 if forward else 1
        if v >= 0:
            return v if at_least(d, v + slack) else UNKNOWN
        return d + v if at_least(d, -v - slack) else UNKNOWN

    if step > 0:
        lo, hi = bound(start, True), bound(end, True)
        span = hi - lo
    else:
        hi, lo = bound(start, False), bound(end, False)
        span = hi - lo
    if is_unknown(span):
        return UNKNOWN
    if isinstance(span, int):
        return max(0, -(-span // abs(step)))
    return ceildiv(span, abs(step)) if at_least(span, 0) else UNKNOWN


def _slice_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    n = operand_length(ctx, 1, "starts", INDEX_DTYPES)
    if operand_length(ctx, 2, "ends", INDEX_DTYPES) != n:
        raise ctx.fail("starts and ends must have one length")
    operands = {"starts": 1, "ends": 2, "axes": 3, "steps": 4}
    for what, i in operands.items():
        if ctx.has(i) and ctx.type(i).dtype != ctx.type(1).dtype:
            raise ctx.fail(f"{what} is {ctx.type(i).dtype} but starts is {ctx.type(1).dtype}")
        if i > 2 and ctx.has(i) and operand_length(ctx, i, what, INDEX_DTYPES) != n:
            raise ctx.fail(f"{what} must have the length of starts ({n})")
    if n > t.rank:
        raise ctx.fail(f"slices {n} axes of a rank-{t.rank} tensor")
    axes = static_ints(ctx, 3, "axes") if ctx.has(3) else list(range(n))
    if axes is None:  # which axes are cut is only known at run time
        return [TensorType(t.dtype, (UNKNOWN,) * t.rank)]
    axes = normalize_axes(ctx.op, axes, t.rank)
    starts, ends = static_ints(ctx, 1, "starts"), static_ints(ctx, 2, "ends")
    steps = static_ints(ctx, 4, "steps") if ctx.has(4) else [1] * n
    if steps is not None and 0 in steps:
        raise ctx.fail(f"steps {steps} must not be 0")
    out = list(t.shape)
    for j, a in enumerate(axes):
        if starts is None or ends is None or steps is None:
            out[a] = UNKNOWN
        else:
            out[a] = _slice_len(ctx, t.shape[a], starts[j], ends[j], steps[j])
    return [TensorType(t.dtype, tuple(out))]


def _slice_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    starts, ends = int_list(ctx.input(1)), int_list(ctx.input(2))
    axes = normalize_axes(ctx.op, int_list(ctx.input(3)), x.ndim) if ctx.has(3) else list(range(len(starts)))
    steps = int_list(ctx.input(4)) if ctx.has(4) else [1] * len(starts)
    if 0 in steps:
        raise ValueError(f"slice steps {steps} must not be 0")
    index: list[slice] = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(s, e, st)  # Python's slice clamping is ONNX's
    return [np.asarray(x[tuple(index)], order="C")]


register(
    OpDef(
        name="slice",
        inputs=("data", "starts", "ends", "axes?", "steps?"),
        infer=_slice_infer,
        reference=_slice_ref,
        doc="data[starts:ends:steps] on `axes` (negative bounds count from the end; bounds clamp).",
    )
)


# tile ----------------------------------------------------------------------


def _tile_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    n, repeats = shape_operand(ctx, 1, "repeats")
    if n != t.rank:
        raise ctx.fail(f"repeats has {n} entries for a rank-{t.rank} input")
    if repeats is None:
        return [TensorType(t.dtype, (UNKNOWN,) * t.rank)]
    if negative(repeats):
        raise ctx.fail(f"repeats {list(map(str, repeats))} must not be negative")
    return [TensorType(t.dtype, tuple(d * r for d, r in zip(t.shape, repeats)))]


def _tile_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, repeats = ctx.input(0), int_list(ctx.input(1))
    if len(repeats) != x.ndim or any(r < 0 for r in repeats):
        raise ValueError(f"tile repeats {repeats} do not fit an input of shape {list(x.shape)}")
    return [np.tile(x, repeats)]


register(
    OpDef(
        name="tile",
        inputs=("input", "repeats"),
        infer=_tile_infer,
        reference=_tile_ref,
        doc="Repeat the input repeats[i] times along each axis i.",
    )
)


# trilu ---------------------------------------------------------------------


def _trilu_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    if t.rank < 2:
        raise ctx.fail(f"input must have rank 2 or more, got {t}")
    if ctx.has(1):
        ctx.require_dtype(1, {DType.i64})
        scalar_operand(ctx, 1, "k")
    return [t]


def _trilu_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    k = int(ctx.input(1).reshape(-1)[0]) if ctx.has(1) else 0
    fn = np.triu if ctx.attrs["upper"] else np.tril
    return [fn(x, k).astype(x.dtype, copy=False)]


register(
    OpDef(
        name="trilu",
        inputs=("input", "k?"),
        attrs={"upper": AttrSpec("int", 1)},
        infer=_trilu_infer,
        reference=_trilu_ref,
        doc="Keep the upper (upper=1) or lower triangle of the last two dims, from diagonal k; zero the rest.",
    )
)

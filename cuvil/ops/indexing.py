"""Ops that read or write a tensor at positions given by an index tensor.

gather, gather_elements, gather_nd, scatter_elements, scatter_nd, one_hot
and non_zero.  Negative indices count from the end of their axis.  An index
outside ``[-n, n)`` is an error of the model's data: the reference raises an
``IndexError`` that names the op, the axis and the offending value, never
wrapping or clipping it (``one_hot`` is the exception ONNX defines: an index
out of range gives a row of off values).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.ir.dtypes import ALL, FLOATS, INTS, DType
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axis
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register
from cuvil.ops.shape import INDEX_DTYPES, scalar_operand

REDUCTIONS = ("none", "add", "mul", "max", "min")


def checked_indices(op: str, indices: np.ndarray, size: int, what: str) -> np.ndarray:
    """``indices`` as int64 in ``[0, size)``: negatives wrap once; anything else outside raises."""
    idx = indices.astype(np.int64, copy=False)
    bad = (idx < -size) | (idx >= size)
    if bad.any():
        first = int(idx[bad].reshape(-1)[0])
        raise IndexError(f"{op}: index {first} is out of range for {what} of size {size}")
    return np.where(idx < 0, idx + size, idx)


def _static_le(a: Dim, b: Dim) -> bool:
    """False only when both dims are static and a > b."""
    return not (isinstance(a, int) and isinstance(b, int) and a > b)


def _reduction(ctx: InferCtx) -> None:
    if ctx.attrs["reduction"] not in REDUCTIONS:
        raise ctx.fail(f"reduction {ctx.attrs['reduction']!r} is not one of {', '.join(REDUCTIONS)}")


# gather --------------------------------------------------------------------


def _gather_infer(ctx: InferCtx) -> list[TensorType]:
    data, ind = ctx.type(0), ctx.type(1)
    ctx.require_dtype(1, INDEX_DTYPES)
    if data.rank == 0:
        raise ctx.fail("data must have rank 1 or more")
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), data.rank)
    return [TensorType(data.dtype, (*data.shape[:axis], *ind.shape, *data.shape[axis + 1 :]))]


def _gather_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), x.ndim)
    idx = checked_indices(ctx.op, ctx.input(1), x.shape[axis], f"axis {axis}")
    return [np.take(x, idx, axis=axis)]


register(
    OpDef(
        name="gather",
        inputs=("data", "indices"),
        attrs={"axis": AttrSpec("int", 0)},
        infer=_gather_infer,
        reference=_gather_ref,
        doc="Take the slices of `data` at `indices` along `axis` (numpy.take).",
    )
)


# gather_elements / scatter_elements ----------------------------------------------


def _elements_check(ctx: InferCtx, ind: TensorType, what: str) -> int:
    """Common checks of the *_elements ops; returns the normalized axis."""
    data = ctx.type(0)
    ctx.require_dtype(1, INDEX_DTYPES)
    if data.rank == 0:
        raise ctx.fail("data must have rank 1 or more")
    if ind.rank != data.rank:
        raise ctx.fail(f"{what} must have the rank of data ({data.rank}), got {ind}")
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), data.rank)
    for i, (a, b) in enumerate(zip(ind.shape, data.shape)):
        if i != axis and not _static_le(a, b):
            raise ctx.fail(f"{what} dim {i} ({a}) exceeds the data dim ({b})")
    return axis


def _element_positions(op: str, x: np.ndarray, indices: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """Full index tuples into ``x``: the entry's own position, with ``indices`` on ``axis``."""
    grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    grid[axis] = checked_indices(op, indices, x.shape[axis], f"axis {axis}")
    return tuple(grid)


def _gather_elements_infer(ctx: InferCtx) -> list[TensorType]:
    ind = ctx.type(1)
    _elements_check(ctx, ind, "indices")
    return [TensorType(ctx.type(0).dtype, ind.shape)]


def _gather_elements_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), x.ndim)
    return [x[_element_positions(ctx.op, x, ctx.input(1), axis)]]


register(
    OpDef(
        name="gather_elements",
        inputs=("data", "indices"),
        attrs={"axis": AttrSpec("int", 0)},
        infer=_gather_elements_infer,
        reference=_gather_elements_ref,
        doc="out[i][j] = data[indices[i][j]][j] for axis 0 (numpy.take_along_axis).",
    )
)


def _scatter_into(out: np.ndarray, where: tuple[np.ndarray, ...], updates: np.ndarray, reduction: str) -> None:
    """Apply ``updates`` to ``out`` at ``where`` in order (later duplicates win for "none")."""
    if reduction == "none":
        out[where] = updates
        return
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    if out.dtype == np.bool_ and reduction in ("add", "mul"):
        ufunc = np.logical_or if reduction == "add" else np.logical_and
    ufunc.at(out, where, updates)


def _scatter_elements_infer(ctx: InferCtx) -> list[TensorType]:
    _reduction(ctx)
    ctx.same_dtype(0, 2)
    ind, upd = ctx.type(1), ctx.type(2)
    _elements_check(ctx, ind, "indices")
    if upd.rank != ind.rank or any(isinstance(a, int) and isinstance(b, int) and a != b
                                   for a, b in zip(upd.shape, ind.shape)):
        raise ctx.fail(f"updates {upd} must have the shape of indices {ind}")
    return [ctx.type(0)]


def _scatter_elements_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    if updates.shape != indices.shape:
        raise ValueError(f"updates shape {list(updates.shape)} differs from indices shape {list(indices.shape)}")
    axis = normalize_axis(ctx.op, int(ctx.attrs["axis"]), x.ndim)
    where = _element_positions(ctx.op, x, indices, axis)
    out = x.copy()
    dense = tuple(np.broadcast_to(w, indices.shape) for w in where)
    _scatter_into(out, dense, updates, ctx.attrs["reduction"])
    return [out]


register(
    OpDef(
        name="scatter_elements",
        inputs=("data", "indices", "updates"),
        attrs={"axis": AttrSpec("int", 0), "reduction": AttrSpec("str", "none")},
        infer=_scatter_elements_infer,
        reference=_scatter_elements_ref,
        doc="A copy of data with out[indices[i][j]][j] = f(out[...], updates[i][j]) for axis 0; "
        "reduction f: none|add|mul|max|min.",
    )
)


# gather_nd / scatter_nd ------------------------------------------------------------


def _nd_depth(ctx: InferCtx, batch_dims: int) -> int:
    """Checks shared by gather_nd and scatter_nd; returns k = indices.shape[-1]."""
    data, ind = ctx.type(0), ctx.type(1)
    ctx.require_dtype(1, {DType.i64})
    if data.rank < 1 or ind.rank < 1:
        raise ctx.fail(f"data and indices must have rank 1 or more, got {data} and {ind}")
    if not 0 <= batch_dims < min(data.rank, ind.rank):
        raise ctx.fail(f"batch_dims {batch_dims} must be in [0, {min(data.rank, ind.rank)})")
    k = ind.shape[-1]
    if not isinstance(k, int):
        raise ctx.fail(f"the last dim of indices ({k}) must be known at compile time: it sets the output rank")
    if not 1 <= k <= data.rank - batch_dims:
        raise ctx.fail(f"the last dim of indices ({k}) must be in [1, {data.rank - batch_dims}]")
    for i in range(batch_dims):
        a, b = ind.shape[i], data.shape[i]
        if isinstance(a, int) and isinstance(b, int) and a != b:
            raise ctx.fail(f"batch dim {i} differs: indices {ind}, data {data}")
    return k


def _nd_positions(op: str, shape: Sequence[int], indices: np.ndarray, batch_dims: int) -> tuple[np.ndarray, ...]:
    """Index arrays into data reshaped to [B, *shape[b:]] (B = product of the batch dims), each [B, M]."""
    k = indices.shape[-1]
    batch = int(np.prod(shape[:batch_dims], dtype=np.int64))
    m = int(np.prod(indices.shape[batch_dims:-1], dtype=np.int64))
    flat = indices.reshape(batch, m, k)
    cols = [
        checked_indices(op, flat[..., j], shape[batch_dims + j], f"axis {batch_dims + j}") for j in range(k)
    ]
    return (np.arange(batch, dtype=np.int64)[:, None], *cols)


def _gather_nd_infer(ctx: InferCtx) -> list[TensorType]:
    b = int(ctx.attrs["batch_dims"])
    k = _nd_depth(ctx, b)
    data, ind = ctx.type(0), ctx.type(1)
    return [TensorType(data.dtype, (*ind.shape[:-1], *data.shape[b + k :]))]


def _gather_nd_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, indices = ctx.input(0), ctx.input(1)
    b = int(ctx.attrs["batch_dims"])
    k = indices.shape[-1]
    if indices.shape[:b] != x.shape[:b]:
        raise ValueError(f"batch dims differ: indices {list(indices.shape)}, data {list(x.shape)}")
    where = _nd_positions(ctx.op, x.shape, indices, b)
    flat = x.reshape((int(np.prod(x.shape[:b], dtype=np.int64)), *x.shape[b:]))
    return [flat[where].reshape((*indices.shape[:-1], *x.shape[b + k :]))]


register(
    OpDef(
        name="gather_nd",
        inputs=("data", "indices"),
        attrs={"batch_dims": AttrSpec("int", 0)},
        infer=_gather_nd_infer,
        reference=_gather_nd_ref,
        doc="Gather the slices data[batch..., *indices[batch..., i, :]]; output indices.shape[:-1] + data.shape[b+k:].",
    )
)


def _scatter_nd_infer(ctx: InferCtx) -> list[TensorType]:
    _reduction(ctx)
    ctx.same_dtype(0, 2)
    k = _nd_depth(ctx, 0)
    data, ind, upd = ctx.type(0), ctx.type(1), ctx.type(2)
    want = (*ind.shape[:-1], *data.shape[k:])
    if upd.rank != len(want) or any(isinstance(a, int) and isinstance(b, int) and a != b
                                    for a, b in zip(upd.shape, want)):
        raise ctx.fail(f"updates {upd} must have shape [{', '.join(map(str, want))}]")
    return [data]


def _scatter_nd_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    k = indices.shape[-1]
    want = (*indices.shape[:-1], *x.shape[k:])
    if updates.shape != want:
        raise ValueError(f"updates shape {list(updates.shape)} must be {list(want)}")
    _, *cols = _nd_positions(ctx.op, x.shape, indices, 0)
    out = x.copy()
    m = int(np.prod(indices.shape[:-1], dtype=np.int64))
    where = tuple(c.reshape(m) for c in cols)
    _scatter_into(out, where, updates.reshape((m, *x.shape[k:])), ctx.attrs["reduction"])
    return [out]


register(
    OpDef(
        name="scatter_nd",
        inputs=("data", "indices", "updates"),
        attrs={"reduction": AttrSpec("str", "none")},
        infer=_scatter_nd_infer,
        reference=_scatter_nd_ref,
        doc="A copy of data with the slices at indices[i, :] set to (or reduced with) updates[i]; "
        "reduction: none|add|mul|max|min.",
    )
)


# one_hot -------------------------------------------------------------------


def _one_hot_infer(ctx: InferCtx) -> list[TensorType]:
    ind, values = ctx.type(0), ctx.type(2)
    ctx.require_dtype(0, INTS | FLOATS)
    ctx.require_dtype(1, INTS | FLOATS)
    scalar_operand(ctx, 1, "depth")
    if values.rank != 1 or (isinstance(values.shape[0], int) and values.shape[0] != 2):
        raise ctx.fail(f"values must be [off_value, on_value] (shape [2]), got {values}")
    axis = int(ctx.attrs["axis"])
    if not -(ind.rank + 1) <= axis <= ind.rank:
        raise ctx.fail(f"axis {axis} is out of range for an output of rank {ind.rank + 1}")
    axis = axis + ind.rank + 1 if axis < 0 else axis
    depth = ctx.const(1)
    n: Dim = UNKNOWN
    if depth is not None:
        n = int(depth.reshape(-1)[0])
        if n < 0:
            raise ctx.fail(f"depth {n} must not be negative")
    return [TensorType(values.dtype, (*ind.shape[:axis], n, *ind.shape[axis:]))]


def _one_hot_ref(ctx: RefCtx) -> list[np.ndarray]:
    indices, values = ctx.input(0), ctx.input(2)
    depth = int(ctx.input(1).reshape(-1)[0])
    if depth < 0:
        raise ValueError(f"one_hot depth {depth} must not be negative")
    rank = indices.ndim
    axis = int(ctx.attrs["axis"])
    axis = axis + rank + 1 if axis < 0 else axis
    idx = indices.astype(np.int64)  # float indices truncate toward zero, as in ONNX
    idx = np.where(idx < 0, idx + depth, idx)  # out-of-range entries match no class: all off
    hot = idx[..., None] == np.arange(depth, dtype=np.int64)
    out = np.where(hot, values[1], values[0]).astype(values.dtype, copy=False)
    return [np.asarray(np.moveaxis(out, -1, axis), order="C")]


register(
    OpDef(
        name="one_hot",
        inputs=("indices", "depth", "values"),
        attrs={"axis": AttrSpec("int", -1)},
        infer=_one_hot_infer,
        reference=_one_hot_ref,
        doc="values[1] where the new `axis` position equals the index (negatives wrap once), values[0] elsewhere.",
    )
)


# non_zero ------------------------------------------------------------------


def _non_zero_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, ALL)
    return [TensorType(DType.i64, (ctx.type(0).rank, UNKNOWN))]


def _non_zero_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    if x.ndim == 0:  # a scalar has no coordinates: [0, 1] when it is nonzero, else [0, 0]
        return [np.zeros((0, int(x != 0)), dtype=np.int64)]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


register(
    OpDef(
        name="non_zero",
        inputs=("X",),
        infer=_non_zero_infer,
        reference=_non_zero_ref,
        doc="The coordinates of the nonzero elements, as i64 [rank, count] (count known at run time).",
    )
)

__all__ = ["REDUCTIONS", "checked_indices"]

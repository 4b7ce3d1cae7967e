"""Ops that change how a tensor's elements are laid out or read its shape.

reshape, flatten, squeeze, unsqueeze, transpose, expand, shape and size.
None of them computes new element values; they carry the symbolic-shape
story of the op set (``reshape`` with ``0``/``-1``, ``flatten`` of symbolic
dims, ``expand``'s bidirectional broadcast).

The module also holds the helpers that read a *shape operand*: a 1-D int64
input whose length is known at compile time (so the result's rank is known)
and whose values may or may not be.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, Dim, floordiv, is_unknown, product, sym
from cuvil.ir.types import TensorType
from cuvil.ops.common import broadcast_shapes, normalize_axes, static_ints, symbolic_ints
from cuvil.ops.registry import SHAPE_ONLY, STORAGE_TYPES, AttrSpec, InferCtx, OpDef, RefCtx, register

INDEX_DTYPES = frozenset({DType.i64, DType.i32})


# Shape operands ------------------------------------------------------------


def operand_length(ctx: InferCtx, i: int, what: str, dtypes: frozenset[DType] = frozenset({DType.i64})) -> int:
    """The static length of the 1-D integer input ``i`` (a shape, axes, repeats...)."""
    t = ctx.type(i)
    if t.dtype not in dtypes:
        names = " or ".join(sorted(str(d) for d in dtypes))
        raise ctx.fail(f"{what} must be {names}, got {t.dtype}")
    if t.rank != 1:
        raise ctx.fail(f"{what} must be a 1-D tensor, got rank {t.rank}")
    n = t.shape[0]
    if not isinstance(n, int):
        raise ctx.fail(f"{what} has a length ({n}) that is not known at compile time, so the output rank is unknown")
    return n


def shape_operand(
    ctx: InferCtx, i: int, what: str, dtypes: frozenset[DType] = frozenset({DType.i64})
) -> tuple[int, list[Dim] | None]:
    """The length of 1-D integer input ``i`` and, when inference can tell, its values as dims:
    the ints of a constant, or sizes computed from other tensors' shapes (``[batch, 2, -1]``)."""
    n = operand_length(ctx, i, what, dtypes)
    values = symbolic_ints(ctx, i, what)
    return n, values if values is not None and len(values) == n else None


def static_operand(
    ctx: InferCtx, i: int, what: str, dtypes: frozenset[DType] = frozenset({DType.i64})
) -> tuple[int, list[int] | None]:
    """The length of 1-D integer input ``i`` and, when it is a constant, its values (axes, splits)."""
    n = operand_length(ctx, i, what, dtypes)
    return n, static_ints(ctx, i, what)


def negative(values: Sequence[Dim]) -> bool:
    """Whether any value is a negative int (symbolic sizes are never negative)."""
    return any(isinstance(v, int) and v < 0 for v in values)


def scalar_operand(ctx: InferCtx, i: int, what: str) -> None:
    """Check that input ``i`` holds one element (a scalar or a 1-element vector)."""
    t = ctx.type(i)
    if t.rank > 1 or (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] != 1):
        raise ctx.fail(f"{what} must be a scalar, got shape {list(map(str, t.shape))}")


def concrete(dims: Sequence[Dim]) -> list[int]:
    """Dims that must be concrete (a reference works on real arrays) as ints."""
    out = [d for d in dims if isinstance(d, int)]
    if len(out) != len(dims):
        raise ValueError(f"dims {[str(d) for d in dims]} are not all concrete")
    return out


def int_list(a: np.ndarray) -> list[int]:
    return [int(x) for x in np.asarray(a).reshape(-1)]


# reshape -------------------------------------------------------------------


def resolve_reshape(
    in_shape: Sequence[Dim], target: Sequence[Dim], allowzero: bool, fail: Callable[[str], Exception]
) -> list[Dim]:
    """The output dims of a reshape of ``in_shape`` to ``target`` (ONNX rules for 0 and -1).

    Written with dim arithmetic, so inference (symbolic dims) and the reference
    (concrete dims) share it: ``[b, 3, h, w] -> [b, -1]`` gives ``[b, 3*h*w]``."""
    dims: list[Dim] = []
    infer_at: int | None = None
    for i, v in enumerate(target):
        if v == -1:
            if infer_at is not None:
                raise fail(f"shape {list(target)} has more than one -1")
            infer_at = i
            dims.append(1)
        elif v == 0 and not allowzero:
            if i >= len(in_shape):
                raise fail(f"shape {list(target)} copies dim {i} (a 0) but the input has rank {len(in_shape)}")
            dims.append(in_shape[i])
        elif isinstance(v, int) and v < 0:
            raise fail(f"shape {list(map(str, target))} has a negative dim {v}")
        else:
            dims.append(v)
    total = product(in_shape)
    if infer_at is not None:
        if allowzero and 0 in target:
            raise fail(f"shape {list(target)} has both a 0 and a -1 with allowzero=1")
        known = product(d for j, d in enumerate(dims) if j != infer_at)
        if known == 0:
            raise fail(f"cannot infer the -1 of shape {list(target)}: the other dims hold no elements")
        if isinstance(total, int) and isinstance(known, int) and total % known:
            raise fail(f"cannot reshape {total} elements to {list(target)}")
        dims[infer_at] = floordiv(total, known)
    else:
        count = product(dims)
        if isinstance(total, int) and isinstance(count, int) and total != count:
            raise fail(f"cannot reshape {total} elements to {list(target)} ({count} elements)")
    return dims


def _reshape_infer(ctx: InferCtx) -> list[TensorType]:
    data = ctx.type(0)
    n, target = shape_operand(ctx, 1, "shape")
    if target is None:
        return [TensorType(data.dtype, (UNKNOWN,) * n)]
    dims = resolve_reshape(data.shape, target, bool(ctx.attrs["allowzero"]), ctx.fail)
    return [TensorType(data.dtype, tuple(dims))]


def _reshape_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    dims = resolve_reshape(x.shape, int_list(ctx.input(1)), bool(ctx.attrs["allowzero"]), ValueError)
    return [x.reshape(concrete(dims))]


register(
    OpDef(
        name="reshape",
        inputs=("data", "shape"),
        attrs={"allowzero": AttrSpec("int", 0)},
        infer=_reshape_infer,
        reference=_reshape_ref,
        traits=frozenset({STORAGE_TYPES}),
        doc="Reshape to `shape` (i64 vector): 0 copies the input dim (unless allowzero=1), -1 is inferred.",
    )
)


# flatten -------------------------------------------------------------------


def _flatten_axis(axis: int, rank: int, fail: Callable[[str], Exception]) -> int:
    if not -rank <= axis <= rank:
        raise fail(f"axis {axis} is out of range for rank {rank} (flatten takes [-rank, rank])")
    return axis + rank if axis < 0 else axis


def _flatten_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    axis = _flatten_axis(int(ctx.attrs["axis"]), t.rank, ctx.fail)
    return [TensorType(t.dtype, (product(t.shape[:axis]), product(t.shape[axis:])))]


def _flatten_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = _flatten_axis(int(ctx.attrs["axis"]), x.ndim, ValueError)
    return [x.reshape(int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))]


register(
    OpDef(
        name="flatten",
        inputs=("input",),
        attrs={"axis": AttrSpec("int", 1)},
        infer=_flatten_infer,
        reference=_flatten_ref,
        traits=frozenset({STORAGE_TYPES}),
        doc="Reshape to 2-D: [prod(dims[:axis]), prod(dims[axis:])]; axis in [-rank, rank].",
    )
)


# squeeze / unsqueeze ---------------------------------------------------------


def _can_be_one(ctx: InferCtx, d: Dim) -> bool:
    """Whether dim ``d`` may equal 1 (a symbol whose minimum is 2 or more cannot)."""
    if isinstance(d, int):
        return d == 1
    if is_unknown(d):
        return True
    names = d.symbols()
    if len(names) == 1:
        (name,) = names
        info = ctx.symbols.get(name)
        if info is not None and info.min is not None and info.min >= 2 and d == sym(name):
            return False
    return True


def _squeeze_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    if not ctx.has(1):
        if any(not isinstance(d, int) and _can_be_one(ctx, d) for d in t.shape):
            raise ctx.fail(
                f"without axes, which dims of {t} are 1 is only known at run time (the output rank is unknown); "
                "give the axes to squeeze"
            )
        return [TensorType(t.dtype, tuple(d for d in t.shape if d != 1))]
    n, axes = static_operand(ctx, 1, "axes")
    if axes is None:
        return [TensorType(t.dtype, (UNKNOWN,) * (t.rank - n))]
    norm = normalize_axes(ctx.op, axes, t.rank)
    for a in norm:
        if isinstance(t.shape[a], int) and t.shape[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of {t}: its size is {t.shape[a]}, not 1")
    return [TensorType(t.dtype, tuple(d for i, d in enumerate(t.shape) if i not in norm))]


def _squeeze_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    if not ctx.has(1):
        return [x.reshape([d for d in x.shape if d != 1])]
    axes = normalize_axes(ctx.op, int_list(ctx.input(1)), x.ndim)
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of shape {list(x.shape)}: its size is not 1")
    return [x.reshape([d for i, d in enumerate(x.shape) if i not in axes])]


register(
    OpDef(
        name="squeeze",
        inputs=("data", "axes?"),
        infer=_squeeze_infer,
        reference=_squeeze_ref,
        traits=frozenset({STORAGE_TYPES}),
        doc="Remove the size-1 dims listed in `axes` (all size-1 dims when omitted).",
    )
)


def _unsqueeze_shape(op: str, shape: Sequence[Dim], axes: Sequence[int]) -> list[Dim]:
    out_rank = len(shape) + len(axes)
    norm = set(normalize_axes(op, axes, out_rank))
    rest = iter(shape)
    return [1 if i in norm else next(rest) for i in range(out_rank)]


def _unsqueeze_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    n, axes = static_operand(ctx, 1, "axes")
    if axes is None:
        return [TensorType(t.dtype, (UNKNOWN,) * (t.rank + n))]
    return [TensorType(t.dtype, tuple(_unsqueeze_shape(ctx.op, t.shape, axes)))]


def _unsqueeze_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    shape = _unsqueeze_shape(ctx.op, x.shape, int_list(ctx.input(1)))
    return [x.reshape(concrete(shape))]


register(
    OpDef(
        name="unsqueeze",
        inputs=("data", "axes"),
        infer=_unsqueeze_infer,
        reference=_unsqueeze_ref,
        traits=frozenset({STORAGE_TYPES}),
        doc="Insert size-1 dims at `axes` (positions in the output, negative counted from its end).",
    )
)


# transpose -----------------------------------------------------------------


def _perm(attr: Sequence[int] | None, rank: int, fail: Callable[[str], Exception]) -> list[int]:
    if attr is None:
        return list(range(rank))[::-1]
    perm = [int(p) for p in attr]
    if sorted(perm) != list(range(rank)):
        raise fail(f"perm {perm} is not a permutation of the {rank} axes")
    return perm


def _transpose_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    perm = _perm(ctx.attrs["perm"], t.rank, ctx.fail)
    return [TensorType(t.dtype, tuple(t.shape[p] for p in perm))]


def _transpose_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    return [np.asarray(np.transpose(x, _perm(ctx.attrs["perm"], x.ndim, ValueError)), order="C")]


register(
    OpDef(
        name="transpose",
        inputs=("data",),
        attrs={"perm": AttrSpec("ints", None)},
        infer=_transpose_infer,
        reference=_transpose_ref,
        doc="Permute the axes: output dim i is input dim perm[i] (default: reversed).",
    )
)


# expand --------------------------------------------------------------------


def _expand_infer(ctx: InferCtx) -> list[TensorType]:
    t = ctx.type(0)
    n, target = shape_operand(ctx, 1, "shape")
    if target is not None:
        if negative(target):
            raise ctx.fail(f"shape {list(map(str, target))} has a negative dim")
        return [TensorType(t.dtype, broadcast_shapes(ctx.op, t.shape, target, ctx=ctx))]
    # The target is computed at run time. A dim the target does not reach, or
    # an input dim known not to be 1, is the output dim whatever the target says.
    rank = max(t.rank, n)
    padded: list[Dim] = [*([1] * (rank - t.rank)), *t.shape]
    out: list[Dim] = []
    for i, d in enumerate(padded):
        covered = i >= rank - n
        out.append(d if not covered or (isinstance(d, int) and d != 1) else UNKNOWN)
    return [TensorType(t.dtype, tuple(out))]


def _expand_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    target = int_list(ctx.input(1))
    shape = np.broadcast_shapes(x.shape, tuple(target))
    return [np.array(np.broadcast_to(x, shape))]  # a copy: broadcast_to gives a read-only view


register(
    OpDef(
        name="expand",
        inputs=("input", "shape"),
        infer=_expand_infer,
        reference=_expand_ref,
        doc="Broadcast `input` with `shape` (bidirectional: the output may be larger than `shape`).",
    )
)


# shape / size ----------------------------------------------------------------


def _shape_bounds(ctx: InferCtx | RefCtx, rank: int) -> tuple[int, int]:
    """ONNX Shape's start/end: negative counts from the end, then clamped to [0, rank]."""
    start = int(ctx.attrs["start"])
    end = rank if ctx.attrs["end"] is None else int(ctx.attrs["end"])
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(start, end)


def _shape_infer(ctx: InferCtx) -> list[TensorType]:
    start, end = _shape_bounds(ctx, ctx.type(0).rank)
    return [TensorType(DType.i64, (end - start,))]


def _shape_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    start, end = _shape_bounds(ctx, x.ndim)
    return [np.array(x.shape[start:end], dtype=np.int64)]


register(
    OpDef(
        name="shape",
        inputs=("data",),
        attrs={"start": AttrSpec("int", 0), "end": AttrSpec("int", None)},
        infer=_shape_infer,
        reference=_shape_ref,
        traits=frozenset({STORAGE_TYPES, SHAPE_ONLY}),
        doc="The input's dims [start, end) as an i64 vector (negative bounds count from the end, then clamp).",
    )
)

register(
    OpDef(
        name="size",
        inputs=("data",),
        infer=lambda ctx: [TensorType(DType.i64, ())],
        reference=lambda ctx: [np.array(ctx.input(0).size, dtype=np.int64)],
        traits=frozenset({STORAGE_TYPES, SHAPE_ONLY}),
        doc="The number of elements of the input, as an i64 scalar.",
    )
)

__all__ = ["INDEX_DTYPES", "concrete", "int_list", "operand_length", "resolve_reshape", "scalar_operand", "shape_operand"]

"""``aten.as_strided``: a view given by sizes, strides and a storage offset, as Cuvil data movement.

PyTorch reads element ``i`` of ``as_strided(x, size, stride, offset)`` at position
``offset + sum(i[k] * stride[k])`` of ``x``'s storage.  The converter knows the
layout torch.export recorded for ``x``; when ``x`` owns its storage densely (its
strides a permutation of a contiguous layout, offset 0: decompositions that keep a
memory format produce such values) its storage is ``x`` transposed into stride
order and flattened, which Cuvil can build.  On that flat buffer the view becomes,
where the strides allow it:

1. a reshape, slice (with steps) and transpose: the dims of size > 1 and stride > 0,
   in decreasing stride order, each stride dividing the one before and each dim's
   extent fitting in the outer dim's step (contiguous sub-blocks, every-k-th
   elements, transposes and permutations, and identities such as the one adaptive
   pooling leaves on a channels-last result);
2. otherwise a gather with a constant index per output element (overlapping windows,
   as ``unfold`` makes, and strides that do not divide each other), up to
   :data:`MAX_GATHER` elements;

then size-1 dims are inserted and stride-0 dims broadcast (``expand``).  Refused,
naming the node and its source line: symbolic sizes, strides or offsets (the view
depends on run-time extents), an input that is a view of a storage Cuvil does not
see (a slice, say: the view could read elements outside it), positions outside the
input, and gathers above the limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cuvil.frontends.torch.aten.common import ints_const, mapping
from cuvil.frontends.torch.converter import TorchCtx
from cuvil.ir.graph import Value

MAX_GATHER = 1 << 22  # index elements of the gather form (32 MiB of int64 indices)


@mapping("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(ctx: TorchCtx) -> Value:
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    size, stride = list(ctx.arg(1, "size")), list(ctx.arg(2, "stride"))
    offset = ctx.arg(3, "storage_offset", None)
    val = ctx.meta(x_node)
    given = [*size, *stride, *([] if offset is None else [offset])]
    shape = [d for d in x.type.shape if isinstance(d, int)]
    if not all(isinstance(v, int) for v in given) or len(shape) != x.type.rank:
        raise ctx.unsupported("symbolic sizes, strides or storage offset: the view would depend on run-time "
                              f"extents (input {list(val.shape)}, size {size}, stride {stride})")
    if len(size) != len(stride):
        raise ctx.fail(f"size {size} and stride {stride} have different lengths")
    if any(s < 0 for s in stride) or any(n < 0 for n in size):
        raise ctx.fail(f"negative sizes or strides ({size}, {stride})")
    order = storage_order(shape, [int(s) for s in val.stride()])
    base_offset = int(val.storage_offset())
    if order is None or base_offset != 0:
        raise ctx.unsupported(f"the input (shape {shape}, strides {list(val.stride())}, storage offset {base_offset}) "
                              "is a view of a larger storage, which the strided view could read outside of")
    start = base_offset if offset is None else int(offset)
    numel = math.prod(shape)
    if math.prod(size) == 0:
        return _reshape(ctx, _flat_slice(ctx, _flat(ctx, x, order), 0, 0), size)
    last = start + sum((n - 1) * s for n, s in zip(size, stride))
    if start < 0 or last >= numel:
        raise ctx.unsupported(f"size {size}, stride {stride} and offset {start} read positions {start}..{last}, "
                              f"outside the input's {numel} elements")
    flat = _flat(ctx, x, order)
    y = _structured(ctx, flat, numel, size, stride, start)
    if y is None:
        y = _gathered(ctx, flat, size, stride, start)
    return y


def storage_order(shape: Sequence[int], strides: Sequence[int]) -> list[int] | None:
    """The dims in decreasing stride order when a tensor of ``shape`` with ``strides`` fills its storage
    densely (a permutation of a contiguous layout; size-1 dims fit anywhere), else None."""
    dims = sorted(range(len(shape)), key=lambda d: (shape[d] == 1, -strides[d], d))
    expect = 1
    for d in reversed([d for d in dims if shape[d] != 1]):
        if strides[d] != expect:
            return None
        expect *= shape[d]
    return dims


def _flat(ctx: TorchCtx, x: Value, order: list[int]) -> Value:
    """``x``'s storage as a 1-D tensor: ``x`` in stride order, flattened."""
    if order != list(range(len(order))) and sum(1 for d in x.type.shape if d != 1) > 1:
        x = ctx.emit1("transpose", [x], {"perm": order})
    return _reshape(ctx, x, [-1]) if x.type.rank != 1 else x


def _reshape(ctx: TorchCtx, x: Value, sizes: Sequence[int]) -> Value:
    if list(x.type.shape) == list(sizes):
        return x
    return ctx.emit1("reshape", [x, ints_const(ctx, list(sizes))], {"allowzero": 1})


def _flat_slice(ctx: TorchCtx, flat: Value, begin: int, end: int) -> Value:
    n = flat.type.shape[0]
    if begin == 0 and end == n:
        return flat
    return ctx.emit1("slice", [flat, ints_const(ctx, [begin]), ints_const(ctx, [end]), ints_const(ctx, [0]),
                               ints_const(ctx, [1])])


def _structured(ctx: TorchCtx, flat: Value, numel: int, size: list[int], stride: list[int],
                start: int) -> Value | None:
    """The view as reshape, slice and transpose of the flat storage, where the strides allow (rule 1)."""
    kept = sorted((k for k in range(len(size)) if size[k] > 1 and stride[k] > 0), key=lambda k: -stride[k])
    s = [stride[k] for k in kept]
    n = [size[k] for k in kept]
    for j in range(1, len(kept)):
        if s[j - 1] % s[j] or n[j] > s[j - 1] // s[j]:
            return None  # equal strides, strides that do not divide, or overlapping rows
    if not kept:
        y = _flat_slice(ctx, flat, start, start + 1)
    else:
        # rows of s[0] elements from `start`: [n0, s0/s1, ..., s(m-2)/s(m-1), s(m-1)], element 0 of the last
        rows = [n[0], *(s[j - 1] // s[j] for j in range(1, len(kept))), s[-1]]
        length = math.prod(rows)
        y = _flat_slice(ctx, flat, start, min(start + length, numel))
        if start + length > numel:  # the last row's tail lies past the input; it is never read
            pad = ctx.constant(np.array([0, start + length - numel], dtype=np.int64))
            y = ctx.emit1("pad", [y, pad], {"mode": "constant"})
        y = _reshape(ctx, y, rows)
        ends = [*n[1:], 1]
        axes = [j for j in range(1, len(rows)) if ends[j - 1] < rows[j]]
        if axes:
            y = ctx.emit1("slice", [y, ints_const(ctx, [0] * len(axes)), ints_const(ctx, [ends[j - 1] for j in axes]),
                                    ints_const(ctx, axes), ints_const(ctx, [1] * len(axes))])
        y = _reshape(ctx, y, n)
        # kept dims from stride order back to the output's order
        perm = sorted(range(len(kept)), key=lambda j: kept[j])
        if perm != list(range(len(kept))):
            y = ctx.emit1("transpose", [y], {"perm": perm})
    return _broadcast(ctx, y, size, stride)


def _broadcast(ctx: TorchCtx, y: Value, size: list[int], stride: list[int]) -> Value:
    """Size-1 dims inserted and stride-0 dims expanded, from the dims of size > 1 and stride > 0."""
    y = _reshape(ctx, y, [n if s > 0 else 1 for n, s in zip(size, stride)])
    if any(s == 0 and n > 1 for n, s in zip(size, stride)):
        y = ctx.emit1("expand", [y, ints_const(ctx, size)])
    return y


def _gathered(ctx: TorchCtx, flat: Value, size: list[int], stride: list[int], start: int) -> Value:
    """The view as one gather from the flat storage, its index computed here (rule 2)."""
    gathered = [n if s > 0 else 1 for n, s in zip(size, stride)]
    count = math.prod(gathered)
    if count > MAX_GATHER:
        raise ctx.unsupported(f"size {size} and stride {stride} overlap or do not nest, so the view needs a gather "
                              f"of {count:,} indices (at most {MAX_GATHER:,})")
    index = np.full(gathered, start, dtype=np.int64)
    for k, (n, s) in enumerate(zip(gathered, stride)):
        shape = [1] * len(gathered)
        shape[k] = n
        index = index + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    y = ctx.emit1("gather", [flat, ctx.constant(index)], {"axis": 0})
    return _broadcast(ctx, y, size, stride)

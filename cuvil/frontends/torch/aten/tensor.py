"""ATen shape and data-movement ops, writes into slices, tensor creation, and arithmetic on symbolic sizes.

Sizes that are ``SymInt`` nodes arrive as int64[1] tensors (``ctx.value``),
so a ``view`` or ``expand`` whose sizes depend on the batch builds its shape
tensor at run time (``ctx.ints``), and shape inference recovers the symbolic
dims from it.  ``clone``, ``alias``, ``lift_fresh_copy``, ``detach`` and
``contiguous`` are identities: Cuvil values are immutable and have no memory
layout of their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.frontends.torch.aten.common import (
    INT64_MAX,
    INT64_MIN,
    axis_of,
    cast,
    ints_const,
    is_node,
    is_sym_scalar,
    mapping,
    scalar_value,
)
from cuvil.frontends.torch.converter import TorchCtx, torch_dtype
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

# identities and casts -----------------------------------------------------------------------------


@mapping("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default")
def _identity(ctx: TorchCtx) -> Value:
    return ctx.value(ctx.arg(0))


@mapping("aten._to_copy.default")
def _to_copy(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dtype = ctx.kwargs.get("dtype")
    return x if dtype is None else cast(ctx, x, torch_dtype(dtype))


@mapping("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
         "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
         "aten._assert_async.msg")
def _no_op(ctx: TorchCtx) -> list[Value | None]:
    # Checks torch.export already proved for every shape the export allows; they compute nothing.
    return []


# views -----------------------------------------------------------------------------------------------


def reshape_to(ctx: TorchCtx, x: Value, sizes: list[Any]) -> Value:
    # allowzero=1: a 0 in the sizes means an empty dim, as in PyTorch, not "copy the input's dim"
    return ctx.emit1("reshape", [x, ctx.ints(sizes)], {"allowzero": 1})


@mapping("aten.view.default", "aten.reshape.default")
def _view(ctx: TorchCtx) -> Value:
    return reshape_to(ctx, ctx.value(ctx.arg(0)), list(ctx.arg(1, "size")))


@mapping("aten.permute.default")
def _permute(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    perm = [axis_of(ctx, int(d), x.type.rank) for d in ctx.arg(1, "dims")]
    if perm == list(range(x.type.rank)):
        return x
    return ctx.emit1("transpose", [x], {"perm": perm})


@mapping("aten.expand.default")
def _expand(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    sizes = list(ctx.arg(1, "size"))
    lead = len(sizes) - x.type.rank
    if lead < 0:
        raise ctx.fail(f"expand to {len(sizes)} dims cannot drop dims of a rank-{x.type.rank} tensor")
    # -1 keeps the input's dim: as a broadcast target, 1 does exactly that
    fixed = [1 if (isinstance(s, int) and s == -1 and i >= lead) else s for i, s in enumerate(sizes)]
    if any(isinstance(s, int) and s < 0 for s in fixed):
        raise ctx.fail(f"expand sizes {sizes}: -1 is only allowed for existing dims")
    return ctx.emit1("expand", [x, ctx.ints(fixed)])


@mapping("aten.unsqueeze.default")
def _unsqueeze(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    d = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank + 1)
    return ctx.emit1("unsqueeze", [x, ints_const(ctx, [d])])


@mapping("aten.squeeze.dims")
def _squeeze(ctx: TorchCtx) -> Value:
    x_node = ctx.arg(0)
    x = ctx.value(x_node)
    r = x.type.rank
    dims = list(ctx.arg(1, "dim"))
    shape = ctx.meta(x_node).shape
    # PyTorch squeezes only the listed dims whose size is 1 and leaves the others alone
    axes = sorted({axis_of(ctx, int(d), r) for d in dims if r and _is_one(shape[axis_of(ctx, int(d), r)])})
    if not axes:
        return x
    return ctx.emit1("squeeze", [x, ints_const(ctx, axes)])


def _is_one(d: Any) -> bool:
    return isinstance(d, int) and d == 1


@mapping("aten.slice.Tensor")
def _slice(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim", 0)), x.type.rank)
    start = ctx.arg(2, "start", None)
    end = ctx.arg(3, "end", None)
    step = ctx.arg(4, "step", 1)
    if not isinstance(step, int) or step <= 0:
        raise ctx.fail(f"slice step must be a positive int, got {step!r}")
    start = 0 if start is None else start
    end = INT64_MAX if end is None else end
    if start == 0 and end == INT64_MAX and step == 1:
        return x
    return ctx.emit1("slice", [x, _index(ctx, start), _index(ctx, end), ints_const(ctx, [dim]),
                               ints_const(ctx, [step])])


def _index(ctx: TorchCtx, v: Any) -> Value:
    """A start/end bound (int or SymInt) as an int64[1] tensor; ints clamp to the int64 range."""
    if isinstance(v, int):
        return ints_const(ctx, [max(INT64_MIN, min(INT64_MAX, v))])
    return ctx.ints([v])


@mapping("aten.select.int")
def _select(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    index = ctx.arg(2, "index")
    idx = scalar_value(ctx, index, DType.i64)
    return ctx.emit1("gather", [x, idx], {"axis": dim})


@mapping("aten.index_select.default")
def _index_select(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    idx = ctx.value(ctx.arg(2, "index"))
    if idx.type.rank == 0:
        idx = ctx.emit1("unsqueeze", [idx, ints_const(ctx, [0])])
    return ctx.emit1("gather", [x, idx], {"axis": dim})


@mapping("aten.embedding.default")
def _embedding(ctx: TorchCtx) -> Value:
    # padding_idx, scale_grad_by_freq and sparse only change the gradient
    return ctx.emit1("gather", [ctx.value(ctx.arg(0)), ctx.value(ctx.arg(1))], {"axis": 0})


@mapping("aten.index.Tensor")
def _index_tensor(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    indices = list(ctx.arg(1, "indices"))
    present = [i for i, t in enumerate(indices) if t is not None]
    if not present:
        return x
    idx = [ctx.value(indices[i]) for i in present]
    for i, v in zip(present, idx):
        if v.type.dtype in (DType.bool, DType.u8):
            raise ctx.unsupported(f"boolean mask indexing (index {i}): its result size depends on the data")
    if len(present) == 1:
        return ctx.emit1("gather", [x, idx[0]], {"axis": present[0]})
    # Several index tensors: move the indexed dims first, broadcast the indices and stack them as
    # gather_nd coordinates; the result starts with the broadcast index shape.
    rank = x.type.rank
    rest = [d for d in range(rank) if d not in present]
    if present + rest != list(range(rank)):
        x = ctx.emit1("transpose", [x], {"perm": present + rest})
    idx = [cast(ctx, v, DType.i64) for v in idx]
    bshape = ctx.emit1("shape", [_bcast_all(ctx, idx)])  # the indices' common broadcast shape
    coords = [ctx.emit1("unsqueeze", [ctx.emit1("expand", [v, bshape]), ints_const(ctx, [-1])]) for v in idx]
    y = ctx.emit1("gather_nd", [x, ctx.emit1("concat", coords, {"axis": -1})])
    adjacent = present == list(range(present[0], present[-1] + 1))
    if adjacent and present[0] > 0:
        # PyTorch keeps adjacent indexed dims in place: move the index dims after the leading dims
        nb = y.type.rank - len(rest)
        lead = present[0]
        perm = list(range(nb, nb + lead)) + list(range(nb)) + list(range(nb + lead, y.type.rank))
        y = ctx.emit1("transpose", [y], {"perm": perm})
    return y


def _bcast_all(ctx: TorchCtx, vals: list[Value]) -> Value:
    """A tensor of the broadcast shape of ``vals`` (their sum; only its shape is used)."""
    acc = vals[0]
    for v in vals[1:]:
        acc = ctx.emit1("add", [acc, v])
    return acc


@mapping("aten.gather.default")
def _gather_elements(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dim = axis_of(ctx, int(ctx.arg(1, "dim")), x.type.rank)
    return ctx.emit1("gather_elements", [x, ctx.value(ctx.arg(2, "index"))], {"axis": dim})


# joining and splitting -----------------------------------------------------------------------------------


@mapping("aten.cat.default")
def _cat(ctx: TorchCtx) -> Value:
    out = ctx.out_type()
    parts = []
    for t in ctx.arg(0, "tensors"):
        v = ctx.value(t)
        if v.type.rank == 1 and v.type.shape[0] == 0 and out.rank != 1:
            continue  # PyTorch's legacy rule: 1-D empty tensors are skipped whatever the other ranks
        parts.append(cast(ctx, v, out.dtype))
    dim = axis_of(ctx, int(ctx.arg(1, "dim", 0)), out.rank)
    if len(parts) == 1:
        return parts[0]
    return ctx.emit1("concat", parts, {"axis": dim})


@mapping("aten.split_with_sizes.default")
def _split_with_sizes(ctx: TorchCtx) -> list[Value]:
    x = ctx.value(ctx.arg(0))
    sizes = list(ctx.arg(1, "split_sizes"))
    dim = axis_of(ctx, int(ctx.arg(2, "dim", 0)), x.type.rank)
    if len(sizes) == 1:
        return [x]
    return ctx.emit(
        "split", [x, ctx.ints(sizes)], {"axis": dim}, num_outputs=len(sizes))


# writes into slices: the functional x[a:b] = y and x.copy_(y) (x[i] = y decomposes to where) -----------


@mapping("aten.copy.default")
def _copy(ctx: TorchCtx) -> Value:
    # copy(self, src): src broadcast to self's shape, in self's dtype (self's values are not read)
    x = ctx.value(ctx.arg(0))
    src = cast(ctx, ctx.tensor(ctx.arg(1, "src"), like=x), x.type.dtype)
    if src.type.shape == x.type.shape:
        return src
    return ctx.emit1("expand", [src, ctx.emit1("shape", [x])])


@mapping("aten.slice_scatter.default")
def _slice_scatter(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    src = cast(ctx, ctx.value(ctx.arg(1, "src")), x.type.dtype)
    dim = axis_of(ctx, int(ctx.arg(2, "dim", 0)), x.type.rank)
    start = ctx.arg(3, "start", None)
    return _write_slice(ctx, x, src, dim, 0 if start is None else start, ctx.arg(5, "step", 1))


def _write_slice(ctx: TorchCtx, x: Value, src: Value, dim: int, start: Any, step: Any) -> Value:
    """``x`` with ``x[..., start::step, ...]`` (along ``dim``, as many positions as ``src`` has there)
    replaced by ``src``: pieces of ``x`` around ``src`` for a unit step, a scatter otherwise."""
    if not isinstance(step, int) or step <= 0:
        raise ctx.fail(f"the step must be a positive int, got {step!r}")
    if not isinstance(start, int):
        raise ctx.unsupported(f"writing into a slice whose start is computed from sizes ({start!r})")
    size, n = x.type.shape[dim], src.type.shape[dim]
    if start < 0:
        if not isinstance(size, int):
            raise ctx.unsupported(f"a negative start ({start}) along the symbolic dim {size}")
        start = max(0, start + size)
    if isinstance(n, int) and n == 0:
        return x
    if step > 1:
        if not isinstance(n, int):
            raise ctx.unsupported(f"writing every {step}th position of a symbolic length {n}")
        index = np.arange(start, start + step * n, step, dtype=np.int64).reshape(
            [n if d == dim else 1 for d in range(x.type.rank)])
        where = ctx.emit1("expand", [ctx.constant(index), ctx.emit1("shape", [src])])
        return ctx.emit1("scatter_elements", [x, where, src], {"axis": dim})
    axis = ints_const(ctx, [dim])
    parts = []
    if start > 0:
        parts.append(ctx.emit1("slice", [x, ints_const(ctx, [0]), ints_const(ctx, [start]), axis]))
    parts.append(src)
    if isinstance(n, int):
        after = ints_const(ctx, [start + n])
    else:  # start + n at run time: the symbolic length is src's dim
        length = ctx.emit1("slice", [ctx.emit1("shape", [src]), ints_const(ctx, [dim]), ints_const(ctx, [dim + 1])])
        after = ctx.emit1("add", [length, ints_const(ctx, [start])])
    if not (isinstance(size, int) and isinstance(n, int) and start + n >= size):
        parts.append(ctx.emit1("slice", [x, after, ints_const(ctx, [INT64_MAX]), axis]))
    return parts[0] if len(parts) == 1 else ctx.emit1("concat", parts, {"axis": dim})


# padding, flips, repeats, triangles ----------------------------------------------------------------------


@mapping("aten.constant_pad_nd.default")
def _constant_pad_nd(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    pad = list(ctx.arg(1, "pad"))
    value = ctx.arg(2, "value", 0)
    r = x.type.rank
    if len(pad) % 2 or len(pad) // 2 > r:
        raise ctx.fail(f"pad {pad} must hold (begin, end) pairs for at most {r} dims")
    begins, ends = [0] * r, [0] * r
    for k in range(len(pad) // 2):  # pairs start at the last dim
        begins[r - 1 - k], ends[r - 1 - k] = pad[2 * k], pad[2 * k + 1]
    if not all(isinstance(p, int) for p in begins + ends):
        raise ctx.fail("symbolic pad amounts are not supported")
    return ctx.emit1("pad", [x, ints_const(ctx, begins + ends), scalar_value(ctx, value, x.type.dtype)],
                     {"mode": "constant"})


@mapping("aten.flip.default")
def _flip(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dims = [axis_of(ctx, int(d), x.type.rank) for d in ctx.arg(1, "dims")]
    if not dims:
        return x
    n = len(dims)
    return ctx.emit1("slice", [x, ints_const(ctx, [-1] * n), ints_const(ctx, [INT64_MIN] * n), ints_const(ctx, dims),
                               ints_const(ctx, [-1] * n)])


@mapping("aten.repeat.default")
def _repeat(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    reps = list(ctx.arg(1, "repeats"))
    extra = len(reps) - x.type.rank
    if extra < 0:
        raise ctx.fail(f"repeat needs at least {x.type.rank} repeats, got {len(reps)}")
    if extra:
        x = ctx.emit1("unsqueeze", [x, ints_const(ctx, list(range(extra)))])
    return ctx.emit1("tile", [x, ctx.ints(reps)])


# creation -----------------------------------------------------------------------------------------------


def _fill_value(ctx: TorchCtx, value: Any, dtype: DType) -> np.ndarray:
    if is_node(value):
        raise ctx.fail("a fill value computed in the graph is not supported")
    return np.array(value, dtype=dtype.np)


@mapping("aten.full.default")
def _full(ctx: TorchCtx) -> Value:
    dtype = ctx.out_type().dtype
    sizes = list(ctx.arg(0, "size"))
    fill = _fill_value(ctx, ctx.arg(1, "fill_value"), dtype)
    if all(isinstance(s, int) for s in sizes):
        return ctx.constant(np.full(sizes, fill, dtype=dtype.np))
    return ctx.emit1("constant_of_shape", [ctx.ints(sizes)], {"value": fill.reshape(1)})


@mapping("aten.full_like.default")
def _full_like(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    dtype = ctx.out_type().dtype
    return ctx.emit1("full_like", [x], {"value": _fill_value(ctx, ctx.arg(1, "fill_value"), dtype)})


@mapping("aten.scalar_tensor.default")
def _scalar_tensor(ctx: TorchCtx) -> Value:
    return scalar_value(ctx, ctx.arg(0, "s"), ctx.out_type().dtype)


@mapping("aten.arange.start_step")
def _arange(ctx: TorchCtx) -> Value:
    dtype = ctx.out_type().dtype
    start, end, step = ctx.arg(0, "start"), ctx.arg(1, "end"), ctx.arg(2, "step", 1)
    if all(isinstance(v, (int, float)) for v in (start, end, step)):
        # computed here as PyTorch does: the length from the double-precision bounds
        n = max(0, int(np.ceil((float(end) - float(start)) / float(step))))
        return ctx.constant((float(start) + np.arange(n, dtype=np.float64) * float(step)).astype(dtype.np)
                            if dtype.is_float else np.arange(start, end, step, dtype=dtype.np)[:n])
    return ctx.emit1("range", [scalar_value(ctx, start, dtype), scalar_value(ctx, end, dtype),
                               scalar_value(ctx, step, dtype)])


# arithmetic on symbolic sizes (SymInt nodes as int64[1]) ---------------------------------------------------


def _size_operand(ctx: TorchCtx, arg: Any) -> Value:
    if isinstance(arg, bool) or not (isinstance(arg, int) or is_sym_scalar(arg)):
        raise ctx.fail(f"size arithmetic on {arg!r} is not supported (only ints and SymInts)")
    # SymInts travel as int64[1] (the converter's convention); keep that shape
    return cast(ctx, ctx.value(arg), DType.i64) if is_sym_scalar(arg) else ints_const(ctx, [arg])


def _nonnegative(ctx: TorchCtx, arg: Any) -> bool:
    """Whether torch's value ranges prove a SymInt (or int) is >= 0."""
    if isinstance(arg, int):
        return arg >= 0
    val = ctx.meta(arg)
    try:
        node = val.node
        return bool(node.shape_env.bound_sympy(node.expr).lower >= 0)
    except (AttributeError, TypeError):
        return False


@mapping("<built-in function add>", "<built-in function sub>", "<built-in function mul>",
         "<built-in function floordiv>", "<built-in function mod>", "<built-in function neg>",
         "_operator.add", "_operator.sub", "_operator.mul", "_operator.floordiv", "_operator.mod", "_operator.neg")
def _sym_arith(ctx: TorchCtx) -> Value:
    name = ctx.target.removeprefix("<built-in function ").removeprefix("_operator.").rstrip(">")
    a = _size_operand(ctx, ctx.arg(0))
    if name == "neg":
        return ctx.emit1("neg", [a])
    b_arg = ctx.arg(1)
    b = _size_operand(ctx, b_arg)
    if name in ("add", "sub", "mul"):
        return ctx.emit1(name, [a, b])
    floor_is_trunc = _nonnegative(ctx, ctx.arg(0)) and isinstance(b_arg, int) and b_arg > 0
    if name == "floordiv":
        if floor_is_trunc:
            return ctx.emit1("div", [a, b])  # equal to floor division here, and shape inference follows it
        rem = ctx.emit1("mod", [a, b], {"fmod": 0})
        return ctx.emit1("div", [ctx.emit1("sub", [a, rem]), b])
    return ctx.emit1("mod", [a, b], {"fmod": 0})


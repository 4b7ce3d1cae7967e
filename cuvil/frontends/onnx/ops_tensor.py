"""Importers of ONNX shape, indexing and tensor-generation ops.

Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice Gather
GatherElements GatherND ScatterElements ScatterND (and the deprecated
Scatter) Expand Tile Shape Size ConstantOfShape EyeLike Range OneHot
NonZero Trilu Unique; and, as compositions of those (gathers and scatters of
computed indices, Pad then Slice), ReverseSequence Compress CenterCropPad
TensorScatter.

Older opsets are upgraded here to the newest form of each op: attributes
that later became inputs (Reshape's shape before 5, Squeeze/Unsqueeze axes
before 13, Split sizes before 13, Slice bounds before 10) become constant
inputs, and changed behaviours (Concat-1's default axis, Split's equal parts
before 18, OneHot-9's negative indices, Tile-1's tiles/axis form) are
reproduced exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer, simple
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

# Legacy attributes with no meaning for a compiler (in-place hints of opset 1).
_LEGACY = frozenset({"consumed_inputs"})


def _check_attrs(ctx: ImportCtx, allowed: Iterable[str]) -> None:
    """Reject an attribute this importer does not translate, rather than ignore it."""
    extra = sorted(set(ctx.attrs) - set(allowed) - _LEGACY)
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} not supported in opset {ctx.opset}")


def _ints(ctx: ImportCtx, values: Sequence[int]) -> Value:
    return ctx.constant(np.asarray(values, dtype=np.int64))


def _required(ctx: ImportCtx, i: int, what: str) -> Value:
    v = ctx.input(i)
    if v is None:
        raise ctx.fail(f"input {i} ({what}) is required")
    return v


# ops whose inputs and attributes map unchanged (every opset) -----------------

simple("Flatten", "flatten")
simple("Transpose", "transpose")
simple("Gather", "gather")
simple("GatherElements", "gather_elements")
simple("GatherND", "gather_nd")
simple("ScatterElements", "scatter_elements")
simple("Scatter", "scatter_elements")  # opsets 9-10: ScatterElements under its old name
simple("ScatterND", "scatter_nd")
simple("Expand", "expand")
simple("Shape", "shape")
simple("Size", "size")
simple("ConstantOfShape", "constant_of_shape")
simple("NonZero", "non_zero")
simple("Trilu", "trilu")


# reshape and friends -------------------------------------------------------


@importer("Reshape")
def _reshape(ctx: ImportCtx) -> list[Value]:
    if ctx.opset < 5:
        _check_attrs(ctx, {"shape"})
        shape = ctx.attr("shape")
        if shape is None:
            raise ctx.fail("Reshape before opset 5 needs the 'shape' attribute")
        return ctx.emit("reshape", [_required(ctx, 0, "data"), _ints(ctx, shape)])
    _check_attrs(ctx, {"allowzero"})
    return ctx.emit("reshape", [_required(ctx, 0, "data"), _required(ctx, 1, "shape")],
                    {"allowzero": int(ctx.attr("allowzero", 0))})


def _axes_op(ctx: ImportCtx, op: str, required: bool) -> list[Value]:
    """Squeeze/Unsqueeze: axes is an attribute before opset 13, an input from 13."""
    data = _required(ctx, 0, "data")
    if ctx.opset < 13:
        _check_attrs(ctx, {"axes"})
        axes = ctx.attr("axes")
        if axes is None:
            if required:
                raise ctx.fail("needs the 'axes' attribute")
            return ctx.emit(op, [data])
        return ctx.emit(op, [data, _ints(ctx, axes)])
    _check_attrs(ctx, ())
    return ctx.emit(op, [data, ctx.input(1)])


@importer("Squeeze")
def _squeeze(ctx: ImportCtx) -> list[Value]:
    return _axes_op(ctx, "squeeze", required=False)


@importer("Unsqueeze")
def _unsqueeze(ctx: ImportCtx) -> list[Value]:
    return _axes_op(ctx, "unsqueeze", required=True)


# concat / split / slice / tile -------------------------------------------------


@importer("Concat")
def _concat(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"axis"})
    axis = ctx.attr("axis")
    if axis is None:
        if ctx.opset >= 4:
            raise ctx.fail("needs the 'axis' attribute")
        axis = 1  # Concat-1's default
    inputs = [v for v in ctx.inputs() if v is not None]
    return ctx.emit("concat", inputs, {"axis": int(axis)})


@importer("Split")
def _split(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"axis", "split", "num_outputs"})
    data = _required(ctx, 0, "input")
    axis = int(ctx.attr("axis", 0))
    parts = len(ctx.node.output)  # every output is a part, even one the model leaves unnamed
    sizes = ctx.attr("split")
    sizes_in = ctx.input(1)
    if sizes is not None and ctx.opset >= 13:
        raise ctx.unsupported("attribute 'split' (an input from opset 13)")
    if sizes_in is not None and 2 <= ctx.opset < 13:
        raise ctx.fail("takes no split input before opset 13 (only the 'split' attribute)")
    if sizes is not None:
        return ctx.emit("split", [data, _ints(ctx, sizes)], {"axis": axis}, num_outputs=parts)
    if sizes_in is not None:
        if ctx.attr("num_outputs") is not None:
            raise ctx.fail("takes either the split input or the num_outputs attribute, not both")
        return ctx.emit("split", [data, sizes_in], {"axis": axis}, num_outputs=parts)
    num = int(ctx.attr("num_outputs", parts))
    if ctx.opset < 18:
        # Before opset 18 the parts are equal; an uneven split was an error, not ceil-sized parts.
        rank = data.type.rank
        dim = data.type.shape[axis] if -rank <= axis < rank else None
        if isinstance(dim, int) and dim % num:
            raise ctx.fail(f"cannot split a dim of {dim} into {num} equal parts (opset {ctx.opset})")
    return ctx.emit("split", [data], {"axis": axis, "num_outputs": num}, num_outputs=parts)


@importer("Slice")
def _slice(ctx: ImportCtx) -> list[Value]:
    data = _required(ctx, 0, "data")
    if ctx.opset < 10:
        _check_attrs(ctx, {"starts", "ends", "axes"})
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        if starts is None or ends is None:
            raise ctx.fail("needs the 'starts' and 'ends' attributes before opset 10")
        inputs = [data, _ints(ctx, starts), _ints(ctx, ends)]
        if axes is not None:
            inputs.append(_ints(ctx, axes))
        return ctx.emit("slice", inputs)
    _check_attrs(ctx, ())
    return ctx.emit("slice", ctx.inputs())


@importer("Tile")
def _tile(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, ())
    data = _required(ctx, 0, "input")
    if ctx.opset >= 6:
        return ctx.emit("tile", [data, _required(ctx, 1, "repeats")])
    # Tile-1 repeats one axis: inputs (input, tiles, axis), both scalars.
    tiles, axis = ctx.const_input(1), ctx.const_input(2)
    if tiles is None or axis is None:
        raise ctx.unsupported("Tile-1 with 'tiles' or 'axis' computed at run time")
    rank = data.type.rank
    a = int(np.asarray(axis).reshape(-1)[0])
    if not -rank <= a < rank:
        raise ctx.fail(f"axis {a} is out of range for rank {rank}")
    repeats = [1] * rank
    repeats[a % rank] = int(np.asarray(tiles).reshape(-1)[0])
    return ctx.emit("tile", [data, _ints(ctx, repeats)])


# generation ----------------------------------------------------------------


@importer("EyeLike")
def _eye_like(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"dtype", "k"})
    attrs: dict[str, object] = {"k": int(ctx.attr("k", 0))}
    if ctx.attr("dtype") is not None:
        attrs["dtype"] = dtype_of(int(ctx.attr("dtype")), f"EyeLike {ctx.name!r} dtype")
    return ctx.emit("eye_like", [_required(ctx, 0, "input")], attrs)


@importer("Range")
def _range(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"stash_type"})
    attrs: dict[str, object] = {}
    if ctx.attr("stash_type") is not None:
        stash = dtype_of(int(ctx.attr("stash_type")), f"Range {ctx.name!r} stash_type")
        if stash not in (DType.f32, DType.f64):
            raise ctx.unsupported(f"stash_type {stash} (FLOAT or DOUBLE only)")
        attrs["stash_type"] = stash
    return ctx.emit("range", [_required(ctx, i, w) for i, w in enumerate(("start", "limit", "delta"))], attrs)


@importer("OneHot")
def _one_hot(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"axis"})
    indices = _required(ctx, 0, "indices")
    depth, values = _required(ctx, 1, "depth"), _required(ctx, 2, "values")
    if ctx.opset < 11 and indices.type.dtype.is_signed:
        # OneHot-9 gives all off values for a negative index; from opset 11 it counts
        # from the end. Send negatives far below -depth, where they still match nothing.
        if indices.type.dtype is not DType.i64:
            indices = ctx.emit1("cast", [indices], {"to": DType.i64})
        negative = ctx.emit1("less", [indices, ctx.constant(np.int64(0))])
        indices = ctx.emit1("where", [negative, ctx.constant(np.int64(-(2**62))), indices])
    return ctx.emit("one_hot", [indices, depth, values], {"axis": int(ctx.attr("axis", -1))})


# ReverseSequence, Compress, CenterCropPad, TensorScatter ----------------------------------------------


def _i64(ctx: ImportCtx, value: int | Sequence[int]) -> Value:
    return ctx.constant(np.asarray(value, dtype=np.int64))


def _dim_scalar(ctx: ImportCtx, x: Value, axis: int) -> Value:
    """``x``'s dim ``axis`` as an int64 scalar (a constant when the dim is static)."""
    d = ctx.emit1("shape", [x], {"start": axis, "end": axis + 1})
    return ctx.emit1("squeeze", [d, _i64(ctx, [0])])


@importer("ReverseSequence")
def _reverse_sequence(ctx: ImportCtx) -> list[Value]:
    """Each batch entry's first ``sequence_lens[b]`` steps reversed: a gather along the time axis of
    ``t < len ? len - 1 - t : t``.  A length past the time dim is an index out of range at run time."""
    _check_attrs(ctx, {"batch_axis", "time_axis"})
    x, lens = _required(ctx, 0, "input"), _required(ctx, 1, "sequence_lens")
    batch_axis, time_axis = int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0))
    if {batch_axis, time_axis} != {0, 1}:
        raise ctx.fail(f"batch_axis {batch_axis} and time_axis {time_axis} must be 0 and 1, one each")
    if x.type.rank < 2:
        raise ctx.fail(f"input must have rank >= 2, got {x.type}")
    if lens.type.rank != 1 or lens.type.dtype is not DType.i64:
        raise ctx.fail(f"sequence_lens must be a 1-D int64 tensor, got {lens.type}")
    steps = ctx.emit1("range", [_i64(ctx, 0), _dim_scalar(ctx, x, time_axis), _i64(ctx, 1)])
    # [T, 1] against [1, B] (time first) or [1, T] against [B, 1]: the index grid over (axis 0, axis 1)
    steps = ctx.emit1("unsqueeze", [steps, _i64(ctx, [1 - time_axis])])
    lens_b = ctx.emit1("unsqueeze", [lens, _i64(ctx, [1 - batch_axis])])
    reversed_ = ctx.emit1("sub", [ctx.emit1("sub", [lens_b, _i64(ctx, 1)]), steps])
    index = ctx.emit1("where", [ctx.emit1("less", [steps, lens_b]), reversed_, steps])
    if x.type.rank > 2:
        index = ctx.emit1("unsqueeze", [index, _i64(ctx, list(range(2, x.type.rank)))])
    index = ctx.emit1("expand", [index, ctx.emit1("shape", [x])])
    return ctx.emit("gather_elements", [x, index], {"axis": time_axis})


@importer("Compress")
def _compress(ctx: ImportCtx) -> list[Value]:
    """The slices along ``axis`` (of the flattened input without one) where ``condition`` holds: a gather
    of ``condition``'s nonzero positions, so the output extent is known at compile time only when the
    condition is.  A condition longer than the axis selects out of range: an error at run time."""
    _check_attrs(ctx, {"axis"})
    x, cond = _required(ctx, 0, "input"), _required(ctx, 1, "condition")
    if cond.type.rank != 1:
        raise ctx.fail(f"condition must be 1-D, got {cond.type}")
    if cond.type.dtype is not DType.bool:
        raise ctx.fail(f"condition must be bool, got {cond.type.dtype}")
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = ctx.emit1("reshape", [x, _i64(ctx, [-1])]), 0
    axis = int(axis)
    if not -x.type.rank <= axis < x.type.rank:
        raise ctx.fail(f"axis {axis} is out of range for input of rank {x.type.rank}")
    picked = ctx.emit1("reshape", [ctx.emit1("non_zero", [cond]), _i64(ctx, [-1])])
    return ctx.emit("gather", [x, picked], {"axis": axis})


@importer("CenterCropPad")
def _center_crop_pad(ctx: ImportCtx) -> list[Value]:
    """Pad with zeros (the odd pixel after) to at least ``shape``, then crop the centred window (the odd
    pixel after), on ``axes``: ONNX's function body, with ``axes`` given to Pad and Slice."""
    _check_attrs(ctx, {"axes"})
    x, shape = _required(ctx, 0, "input_data"), _required(ctx, 1, "shape")
    rank = x.type.rank
    axes = [int(a) for a in ctx.attr("axes", list(range(rank)))]
    if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
        raise ctx.fail(f"axes {axes} must be distinct axes of the input of rank {rank}")
    if shape.type.rank != 1 or shape.type.dtype not in (DType.i64, DType.i32):
        raise ctx.fail(f"shape must be a 1-D int32 or int64 tensor, got {shape.type}")
    if isinstance(shape.type.shape[0], int) and shape.type.shape[0] != len(axes):
        raise ctx.fail(f"shape has {shape.type.shape[0]} values for {len(axes)} axes")
    if shape.type.dtype is not DType.i64:
        shape = ctx.emit1("cast", [shape], {"to": DType.i64})
    axes_v = _i64(ctx, [a % rank for a in axes])
    two = _i64(ctx, 2)

    def dims(v: Value) -> Value:
        return ctx.emit1("gather", [ctx.emit1("shape", [v]), axes_v], {"axis": 0})

    have = dims(x)
    pad = ctx.emit1("sub", [ctx.emit1("max", [have, shape]), have])
    before = ctx.emit1("div", [pad, two])
    pads = ctx.emit1("concat", [before, ctx.emit1("sub", [pad, before])], {"axis": 0})
    padded = ctx.emit1("pad", [x, pads, None, axes_v], {"mode": "constant"})
    start = ctx.emit1("div", [ctx.emit1("sub", [dims(padded), shape]), two])
    return ctx.emit("slice", [padded, start, ctx.emit1("add", [start, shape]), axes_v])


@importer("TensorScatter")
def _tensor_scatter(ctx: ImportCtx) -> list[Value]:
    """``update`` written into ``past_cache`` along ``axis`` from each batch entry's ``write_indices[b]``
    (modulo the cache length in ``circular`` mode): a scatter of ``update`` at ``write + s``."""
    _check_attrs(ctx, {"axis", "mode"})
    past, update = _required(ctx, 0, "past_cache"), _required(ctx, 1, "update")
    write = ctx.input(2)
    mode = str(ctx.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode {mode!r} (TensorScatter has linear and circular)")
    rank = past.type.rank
    axis = int(ctx.attr("axis", -2))
    if not -rank <= axis < rank or axis % rank == 0:
        raise ctx.fail(f"axis {axis} must be a non-batch axis of the cache of rank {rank}")
    axis %= rank
    if update.type.rank != rank or update.type.dtype is not past.type.dtype:
        raise ctx.fail(f"update {update.type} must have the rank and type of past_cache {past.type}")
    steps = ctx.emit1("range", [_i64(ctx, 0), _dim_scalar(ctx, update, axis), _i64(ctx, 1)])
    index = ctx.emit1("reshape", [steps, _i64(ctx, [-1 if a == axis else 1 for a in range(rank)])])
    if write is not None:
        if write.type.rank != 1 or write.type.dtype is not DType.i64:
            raise ctx.fail(f"write_indices must be a 1-D int64 tensor, got {write.type}")
        start = ctx.emit1("reshape", [write, _i64(ctx, [-1] + [1] * (rank - 1))])
        index = ctx.emit1("add", [index, start])
    if mode == "circular":
        index = ctx.emit1("mod", [index, _dim_scalar(ctx, past, axis)])
    index = ctx.emit1("expand", [index, ctx.emit1("shape", [update])])
    return ctx.emit("scatter_elements", [past, index, update], {"axis": axis})


@importer("Unique", since=11)
def _unique(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"axis", "sorted"})
    x = _required(ctx, 0, "X")
    sorted_ = int(ctx.attr("sorted", 1))
    if sorted_ not in (0, 1):
        raise ctx.unsupported(f"sorted={sorted_} (0: order of first occurrence, 1: ascending)")
    axis = ctx.attr("axis")
    return ctx.emit("unique", [x], {"axis": None if axis is None else int(axis), "sorted": sorted_}, num_outputs=4)

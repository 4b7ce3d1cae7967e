"""Importers of ONNX shape, indexing and tensor-generation ops.

Reshape Flatten Squeeze Unsqueeze Transpose Concat Split Slice Gather
GatherElements GatherND ScatterElements ScatterND (and the deprecated
Scatter) Expand Tile Shape Size ConstantOfShape EyeLike Range OneHot
NonZero Trilu Unique.

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


@importer("Unique", since=11)
def _unique(ctx: ImportCtx) -> list[Value]:
    _check_attrs(ctx, {"axis", "sorted"})
    x = _required(ctx, 0, "X")
    sorted_ = int(ctx.attr("sorted", 1))
    if sorted_ not in (0, 1):
        raise ctx.unsupported(f"sorted={sorted_} (0: order of first occurrence, 1: ascending)")
    axis = ctx.attr("axis")
    return ctx.emit("unique", [x], {"axis": None if axis is None else int(axis), "sorted": sorted_}, num_outputs=4)

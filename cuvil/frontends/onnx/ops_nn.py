"""Importers of ONNX's spatial ops: Conv, ConvTranspose, the pools (LpPool, GlobalLpPool and MaxUnpool
among them), Pad, Resize and Upsample, DepthToSpace, SpaceToDepth, AffineGrid,
Col2Im.

Conv, the pools and the depth/space ops kept their meaning across opsets (later versions only
added attributes whose defaults reproduce the earlier behaviour), so their attributes pass
straight through; the Cuvil op rejects any it does not know.  Pad and Resize changed shape
over time and are upgraded here:

* Pad-1 (``paddings``, ``value``) and Pad-2 (``pads``, ``value``) attributes become the
  ``pads`` and ``constant_value`` inputs of Pad-11+.
* Resize-10 (``X``, ``scales``; asymmetric coordinates) becomes the newest Resize with the
  coordinate mode and nearest rounding that onnxruntime gives Resize-10.  Resize-11/13 take an
  ``roi`` and ``scales`` that are often empty placeholders; those are dropped.

LpPool, GlobalLpPool, MaxUnpool, Upsample (opsets 1-9) and AffineGrid have no Cuvil op of their own:
each is an exact composition of existing ops (an average pool, a scatter, a Resize, a matmul), so
every target runs them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ops.common import const_of
from cuvil.ops.conv import WindowAttrs, window_out_dim


def _pass_through(op_type: str, cuvil_op: str) -> None:
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        return ctx.emit(cuvil_op, ctx.inputs(), dict(ctx.attrs), num_outputs=ctx.num_outputs)

    importer(op_type)(fn)


for _onnx, _cuvil in {
    "Conv": "conv",
    "ConvTranspose": "conv_transpose",
    "MaxPool": "max_pool",
    "AveragePool": "average_pool",
    "GlobalAveragePool": "global_average_pool",
    "GlobalMaxPool": "global_max_pool",
    "DepthToSpace": "depth_to_space",
    "SpaceToDepth": "space_to_depth",
    "Col2Im": "col2im",
}.items():
    _pass_through(_onnx, _cuvil)


# Pad ---------------------------------------------------------------------------------------------


@importer("Pad")
def _pad(ctx: ImportCtx) -> Sequence[Value | None]:
    data = ctx.input(0)
    if data is None:
        raise ctx.fail("Pad needs its data input")
    mode = ctx.attr("mode", "constant")
    if ctx.opset >= 11:
        extra = sorted(set(ctx.attrs) - {"mode"})
        if extra:
            raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Pad-{ctx.opset}")
        return ctx.emit("pad", ctx.inputs(), {"mode": mode})
    name = "paddings" if ctx.opset < 2 else "pads"
    pads = ctx.attr(name)
    if pads is None:
        raise ctx.fail(f"Pad-{ctx.opset} needs the {name!r} attribute")
    extra = sorted(set(ctx.attrs) - {"mode", "value", name})
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Pad-{ctx.opset}")
    pads_v = ctx.constant(np.asarray(pads, dtype=np.int64))
    value = ctx.constant(np.asarray(ctx.attr("value", 0.0)).astype(data.type.dtype.np))
    return ctx.emit("pad", [data, pads_v, value], {"mode": mode})


# Resize ------------------------------------------------------------------------------------------

_RESIZE_10_MODES = ("nearest", "linear")


def _is_empty_const(v: Value | None) -> bool:
    c = const_of(v)
    return c is not None and c.size == 0


@importer("Resize")
def _resize(ctx: ImportCtx) -> Sequence[Value | None]:
    if ctx.opset < 11:
        return _resize_10(ctx)
    x, roi, scales, sizes = (ctx.input(i) for i in range(4))
    if x is None:
        raise ctx.fail("Resize needs its X input")
    attrs = dict(ctx.attrs)
    if ctx.opset < 18:
        for name in ("antialias", "axes", "keep_aspect_ratio_policy"):
            if name in attrs:
                raise ctx.unsupported(f"attribute {name!r} is not part of Resize-{ctx.opset}")
    # roi only takes effect with tf_crop_and_resize; elsewhere it is a placeholder.
    if attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize" or _is_empty_const(roi):
        roi = None
    if _is_empty_const(scales):
        scales = None
    if _is_empty_const(sizes):
        sizes = None
    return ctx.emit("resize", [x, roi, scales, sizes], attrs)


def _resize_10(ctx: ImportCtx) -> Sequence[Value | None]:
    """Resize-10: ``output = floor(input * scale)`` with asymmetric coordinates.

    onnxruntime (the runtime these models were written against) rounds nearest source indices
    down on upsampled axes and up on downsampled ones; one rounding attribute cannot say both,
    so a nearest resize that does both becomes two resizes over disjoint axes (nearest
    resizing is separable, so this is exact)."""
    x, scales = ctx.input(0), ctx.input(1)
    if x is None or scales is None:
        raise ctx.fail("Resize-10 needs the X and scales inputs")
    extra = sorted(set(ctx.attrs) - {"mode"})
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Resize-10")
    mode = ctx.attr("mode", "nearest")
    if mode not in _RESIZE_10_MODES:
        raise ctx.unsupported(f"mode {mode!r} (Resize-10 has nearest and linear)")
    base = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "linear":
        return ctx.emit("resize", [x, None, scales, None], base)
    values = const_of(scales)
    if values is None:
        raise ctx.unsupported("nearest Resize-10 with run-time scales (its rounding depends on the scale values)")
    vals = [float(s) for s in values.reshape(-1)]
    if len(vals) != x.type.rank:
        raise ctx.fail(f"scales has {len(vals)} values for an input of rank {x.type.rank}")
    up = [a for a, s in enumerate(vals) if s >= 1]
    down = [a for a, s in enumerate(vals) if s < 1]
    y = x
    for axes, rounding in ((up, "floor"), (down, "ceil")):
        if not axes:
            continue
        part = ctx.constant(np.asarray([vals[a] for a in axes], dtype=np.float32), DType.f32)
        y = ctx.emit1("resize", [y, None, part, None], {**base, "nearest_mode": rounding, "axes": axes})
    return [y]


# LpPool, GlobalLpPool ----------------------------------------------------------------------------


def _power(ctx: ImportCtx, x: Value, p: float) -> Value:
    """``x ** p`` for ``x >= 0``: products for the usual p (exact), pow otherwise."""
    if p == 1:
        return x
    if p == 2:
        return ctx.emit1("mul", [x, x])
    return ctx.emit1("pow", [x, ctx.constant(np.asarray(p, dtype=x.type.dtype.np))])


def _root(ctx: ImportCtx, x: Value, p: float) -> Value:
    if p == 1:
        return x
    if p == 2:
        return ctx.emit1("sqrt", [x])
    return ctx.emit1("pow", [x, ctx.constant(np.asarray(1.0 / p, dtype=x.type.dtype.np))])


def _lp_p(ctx: ImportCtx) -> float:
    p = float(ctx.attr("p", 2))
    if not p > 0:
        raise ctx.fail(f"p must be positive, got {p}")
    return p


@importer("LpPool")
def _lp_pool(ctx: ImportCtx) -> Sequence[Value | None]:
    """``(sum of |x|^p over each window) ^ (1/p)``, the padding counting as zeros.

    The window sum is an average pool that counts the padding, times the window's size.  An average
    pool does not count the taps of a ``ceil_mode`` window that overhang the end padding, so with
    ``ceil_mode`` the input is first padded with zeros up to the last window's end."""
    window: tuple[str, ...] = ("auto_pad", "kernel_shape", "pads", "strides")
    window += ("ceil_mode", "dilations") if ctx.opset >= 18 else ()
    known_attrs(ctx, (*window, "p"))
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("needs its input X")
    if "kernel_shape" not in ctx.attrs:
        raise ctx.fail("attribute 'kernel_shape' is required")
    p = _lp_p(ctx)
    attrs = {k: ctx.attrs[k] for k in window if k in ctx.attrs}
    kernel = [int(k) for k in attrs["kernel_shape"]]
    powered = _power(ctx, ctx.emit1("abs", [x]), p)
    if int(attrs.pop("ceil_mode", 0)):
        powered = _pad_for_ceil_mode(ctx, powered, kernel, attrs)
    mean = ctx.emit1("average_pool", [powered], {**attrs, "count_include_pad": 1})
    total = ctx.emit1("mul", [mean, ctx.constant(np.asarray(math.prod(kernel), dtype=x.type.dtype.np))])
    return [_root(ctx, total, p)]


def _pad_for_ceil_mode(ctx: ImportCtx, x: Value, kernel: list[int], attrs: dict[str, Any]) -> Value:
    """``x`` zero-padded at the end of each spatial dim so that floor-mode windows reach as far as the
    ``ceil_mode`` windows of ``attrs`` do (which it updates: no ceil_mode, the same window count)."""
    n = x.type.rank - 2
    if attrs.get("auto_pad", "NOTSET") != "NOTSET":
        return x  # SAME and VALID windows never overhang: ceil_mode changes nothing
    spatial = x.type.shape[2:]
    if len(kernel) != n or not all(isinstance(d, int) for d in spatial):
        raise ctx.unsupported(f"ceil_mode=1 with symbolic spatial dims {x.type}")
    pads = [int(v) for v in attrs.get("pads") or [0] * (2 * n)]
    strides = [int(v) for v in attrs.get("strides") or [1] * n]
    dilations = [int(v) for v in attrs.get("dilations") or [1] * n]
    w = WindowAttrs(tuple(strides), tuple(dilations), tuple(pads[:n]), tuple(pads[n:]), "NOTSET")
    extra = []
    for i, size in enumerate(spatial):
        out = window_out_dim(size, kernel[i], i, w, ceil_mode=True)
        assert isinstance(out, int) and isinstance(size, int)
        reach = (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        extra.append(max(reach - (size + pads[i] + pads[n + i]), 0))
    if not any(extra):
        return x
    widths = ctx.constant(np.asarray([0] * (n + 2) + [0, 0] + extra, dtype=np.int64))
    return ctx.emit1("pad", [x, widths], {"mode": "constant"})


@importer("GlobalLpPool")
def _global_lp_pool(ctx: ImportCtx) -> Sequence[Value | None]:
    """``(sum of |x|^p over all spatial dims) ^ (1/p)``, the spatial dims kept as 1."""
    known_attrs(ctx, ("p",))
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("needs its input X")
    if x.type.rank < 3:
        raise ctx.fail(f"X must have rank >= 3 ([N, C, spatial...]), got {x.type}")
    if not x.type.dtype.is_float:
        raise ctx.fail(f"X must be floating-point, got {x.type.dtype}")
    p = _lp_p(ctx)
    axes = ctx.constant(np.arange(2, x.type.rank, dtype=np.int64))
    total = ctx.emit1("reduce_sum", [_power(ctx, ctx.emit1("abs", [x]), p), axes], {"keepdims": 1})
    return [_root(ctx, total, p)]


# Upsample (opsets 1-9) ---------------------------------------------------------------------------


@importer("Upsample")
def _upsample(ctx: ImportCtx) -> Sequence[Value | None]:
    """Upsample is Resize with ``asymmetric`` coordinates (``out = floor(in * scale)``), nearest
    source indices rounded down, as onnxruntime computes it; scales below 1 are not Upsample's."""
    x = ctx.input(0)
    if x is None:
        raise ctx.fail("needs its input X")
    if ctx.opset >= 10:
        raise ctx.unsupported(f"Upsample-{ctx.opset} (deprecated from opset 10: Resize replaces it)")
    if ctx.opset < 7:
        known_attrs(ctx, ("mode", "height_scale", "width_scale"))
        if x.type.rank != 4:
            raise ctx.fail(f"Upsample-1 takes an [N, C, H, W] input, got {x.type}")
        if "height_scale" not in ctx.attrs or "width_scale" not in ctx.attrs:
            raise ctx.fail("Upsample-1 needs the 'height_scale' and 'width_scale' attributes")
        values: Any = [1.0, 1.0, float(ctx.attrs["height_scale"]), float(ctx.attrs["width_scale"])]
    elif ctx.opset < 9:
        known_attrs(ctx, ("mode", "scales"))
        if "scales" not in ctx.attrs:
            raise ctx.fail("attribute 'scales' is required")
        values = [float(s) for s in ctx.attrs["scales"]]
    else:
        known_attrs(ctx, ("mode",))
        values = None
    mode = {"bilinear": "linear"}.get(str(ctx.attr("mode", "nearest")), str(ctx.attr("mode", "nearest")))
    if mode not in _RESIZE_10_MODES:
        raise ctx.unsupported(f"mode {ctx.attr('mode')!r} (Upsample has nearest and linear)")
    if values is not None:
        if len(values) != x.type.rank:
            raise ctx.fail(f"scales has {len(values)} values for an input of rank {x.type.rank}")
        if any(s < 1 for s in values):
            raise ctx.fail(f"scales must be >= 1, got {values}")
        scales = ctx.constant(np.asarray(values, dtype=np.float32))
    else:
        given = ctx.input(1)
        if given is None:
            raise ctx.fail("needs the scales input")
        scales = given
        known = ctx.const_input(1)
        if known is not None and np.any(known < 1):
            raise ctx.fail(f"scales must be >= 1, got {known.tolist()}")
    attrs: dict[str, Any] = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "nearest":
        attrs["nearest_mode"] = "floor"
    return ctx.emit("resize", [x, None, scales, None], attrs)


# MaxUnpool ---------------------------------------------------------------------------------------


@importer("MaxUnpool")
def _max_unpool(ctx: ImportCtx) -> Sequence[Value | None]:
    """Zeros of the output's shape with ``X`` scattered to the flat positions ``I`` (MaxPool's indices).

    The output's shape is ``output_shape`` when given, else ``(in - 1) * stride + kernel - pads`` per
    spatial dim.  The indices are linear in the output tensor ("in the range [0, N x C x D1 x ... x Dn)",
    as the operator page says and onnxruntime computes).  ONNX's reference evaluator instead scatters
    into the computed shape and pads that at the end up to ``output_shape``, and so does the stored
    output of the conformance case with an ``output_shape``: the two agree wherever ``output_shape``
    is the computed shape."""
    known_attrs(ctx, ("kernel_shape", "pads", "strides"))
    x, indices, out_shape = ctx.input(0), ctx.input(1), ctx.input(2)
    if x is None or indices is None:
        raise ctx.fail("needs the inputs X and I")
    if "kernel_shape" not in ctx.attrs:
        raise ctx.fail("attribute 'kernel_shape' is required")
    n = x.type.rank - 2
    kernel = [int(k) for k in ctx.attrs["kernel_shape"]]
    strides = [int(s) for s in ctx.attr("strides", None) or [1] * n]
    pads = [int(p) for p in ctx.attr("pads", None) or [0] * (2 * n)]
    if n < 1 or len(kernel) != n or len(strides) != n or len(pads) != 2 * n:
        raise ctx.fail(f"kernel_shape {kernel}, strides {strides} and pads {pads} do not fit X {x.type}")
    if indices.type.dtype is not DType.i64 or indices.type.rank != x.type.rank:
        raise ctx.fail(f"I must be int64 of X's rank, got {indices.type} for X {x.type}")
    i64 = np.int64
    if out_shape is None:
        in_dims = ctx.emit1("shape", [x])
        scale = ctx.constant(np.asarray([1, 1, *strides], dtype=i64))
        grow = ctx.constant(np.asarray([0, 0, *(k - s - pads[i] - pads[n + i]
                                                for i, (k, s) in enumerate(zip(kernel, strides)))], dtype=i64))
        # (in - 1) * s + k - pads  ==  in * s + (k - s - pads); N and C unchanged
        out_shape = ctx.emit1("add", [ctx.emit1("mul", [in_dims, scale]), grow])
    elif out_shape.type.dtype is not DType.i64 or out_shape.type.rank != 1:
        raise ctx.fail(f"output_shape must be a 1-D int64 tensor, got {out_shape.type}")
    total = ctx.emit1("reduce_prod", [out_shape], {"keepdims": 1})
    zeros = ctx.emit1("constant_of_shape", [total], {"value": np.zeros((1,), dtype=x.type.dtype.np)})
    flat = ctx.constant(np.asarray([-1], dtype=i64))
    values = ctx.emit1("reshape", [x, flat])
    scattered = ctx.emit1("scatter_elements", [zeros, ctx.emit1("reshape", [indices, flat]), values], {"axis": 0})
    return ctx.emit("reshape", [scattered, out_shape])


# AffineGrid --------------------------------------------------------------------------------------


@importer("AffineGrid")
def _affine_grid(ctx: ImportCtx) -> Sequence[Value | None]:
    """``theta @ [x, y, (z,) 1]`` over the normalised coordinates of every output position.

    Along a spatial dim of length L the coordinates are ``-1 + (2i + 1) / L`` (``align_corners=0``) or
    ``-1 + 2i / (L - 1)`` (``align_corners=1``).  For a dim of 1 with ``align_corners=1`` the readings
    differ (ONNX's function body: -1 for the depth, NaN otherwise; PyTorch: 0; onnxruntime: 1): Cuvil
    gives onnxruntime's 1.  ``size`` may be a run-time tensor: the grid's dims are then run-time extents."""
    known_attrs(ctx, ("align_corners",))
    theta, size = ctx.input(0), ctx.input(1)
    if theta is None or size is None:
        raise ctx.fail("needs the inputs theta and size")
    if theta.type.rank != 3 or not theta.type.dtype.is_float:
        raise ctx.fail(f"theta must be a float [N, 2, 3] or [N, 3, 4] tensor, got {theta.type}")
    n_size = size.type.shape[0] if size.type.rank == 1 else None
    if size.type.dtype is not DType.i64 or n_size not in (4, 5):
        raise ctx.fail(f"size must be an int64 tensor of 4 or 5 values ([N, C, (D,) H, W]), got {size.type}")
    assert isinstance(n_size, int)
    nd = n_size - 2
    if theta.type.shape[1:] != (nd, nd + 1) and all(isinstance(d, int) for d in theta.type.shape[1:]):
        raise ctx.fail(f"theta {theta.type} does not fit a size of {n_size} values (needs [N, {nd}, {nd + 1}])")
    dt = theta.type.dtype.np
    i64 = np.int64

    def c(v: float) -> Value:
        return ctx.constant(np.asarray(v, dtype=dt))

    def ints(v: list[int]) -> Value:
        return ctx.constant(np.asarray(v, dtype=i64))

    spatial = ctx.emit1("slice", [size, ints([2]), ints([n_size])])  # [(D,) H, W]
    align = bool(ctx.attr("align_corners", 0))
    axes = []  # coordinates along W, H, (D): x, y, (z)
    for j in reversed(range(nd)):
        length = ctx.emit1("squeeze", [ctx.emit1("slice", [spatial, ints([j]), ints([j + 1])]), ints([0])])
        lf = ctx.emit1("cast", [length], {"to": theta.type.dtype})
        if align:
            unit = ctx.emit1("equal", [length, ctx.constant(i64(1))])
            wide = ctx.emit1("div", [c(2.0), ctx.emit1("sub", [lf, c(1.0)])])
            step = ctx.emit1("where", [unit, c(0.0), wide])
            start = ctx.emit1("where", [unit, c(1.0), c(-1.0)])
        else:
            step = ctx.emit1("div", [c(2.0), lf])
            start = ctx.emit1("add", [c(-1.0), ctx.emit1("div", [step, c(2.0)])])
        steps = ctx.emit1("range", [ctx.constant(i64(0)), length, ctx.constant(i64(1))])
        coords = ctx.emit1("add", [start, ctx.emit1("mul", [ctx.emit1("cast", [steps], {"to": theta.type.dtype}), step])])
        # along spatial dim j of [(D,) H, W, 1]
        shaped = ctx.emit1("reshape", [coords, ints([-1 if a == j else 1 for a in range(nd)] + [1])])
        axes.append(ctx.emit1("expand", [shaped, ctx.emit1("concat", [spatial, ints([1])], {"axis": 0})]))
    ones = ctx.emit1("expand", [c(1.0), ctx.emit1("concat", [spatial, ints([1])], {"axis": 0})])
    base = ctx.emit1("concat", [*axes, ones], {"axis": -1})  # [(D,) H, W, nd + 1]
    points = ctx.emit1("transpose", [ctx.emit1("reshape", [base, ints([-1, nd + 1])])], {"perm": [1, 0]})
    grid = ctx.emit1("transpose", [ctx.emit1("matmul", [theta, points])], {"perm": [0, 2, 1]})  # [N, P, nd]
    shape = ctx.emit1("concat", [ctx.emit1("slice", [size, ints([0]), ints([1])]), spatial, ints([nd])], {"axis": 0})
    return ctx.emit("reshape", [grid, shape])

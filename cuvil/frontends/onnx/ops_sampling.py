"""Importers of ONNX's sampling ops: GridSample, RoiAlign and DeformConv, as gathers and weights.

Each op reads its input at computed, fractional positions.  Interpolation is separable, so
every spatial axis gives, per output position, a few *taps*: an integer index into that
axis (already made valid by the op's padding rule), a weight, and for zero padding a flag
saying whether the tap lies inside.  The taps of all axes combine into flat indices into
the input laid out as ``[batch, positions, channels]``; one ``gather_nd`` per combination
fetches all channels at once, and the weighted sum of the gathered rows is the result.

The arithmetic follows the ONNX reference implementations step for step (coordinates
denormalized, rounded or reflected in the order they give), computed in float32 (float64
for float64 operands) whatever the input's element type.

GridSample: every mode (``nearest``, ``linear``, ``cubic``; ``bilinear``/``bicubic``
before opset 20), padding mode and ``align_corners``, on any number of spatial axes (the
4-D form before opset 20, as ONNX defines it).

RoiAlign: both modes and coordinate transformations, with a positive ``sampling_ratio`` (the
samples of a bin are then a fixed grid, gathered one sample position at a time); the adaptive
``sampling_ratio=0``, whose sample count each ROI's size sets at run time, is refused.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.frontends.onnx.arith import Arith
from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.graph import Value

_CUBIC_A = -0.75  # the cubic convolution constant ONNX's GridSample uses (Keys, 1981)


@dataclass(frozen=True)
class Tap:
    """One tap of one spatial axis: a valid int64 index, its weight (None: 1) and inside flag (None: always)."""

    index: Value
    weight: Value | None = None
    inside: Value | None = None


def compute_type(*values: Value) -> DType:
    return DType.f64 if any(v.type.dtype is DType.f64 for v in values) else DType.f32


def channels_last(a: Arith, x: Value) -> Value:
    """``x`` [N, C, *spatial] as [N, prod(spatial), C] in the working type (the rows gather_nd fetches)."""
    r = x.type.rank
    xt = a.transpose(a.cast(x, a.dtype), [0, *range(2, r), 1])
    return a.reshape(xt, a.concat([a.shape(x, 0, 1), a.ints([-1]), a.shape(x, 1, 2)]))


def spatial_strides(a: Arith, x: Value) -> list[Value]:
    """The int64 stride of each spatial axis of ``x`` in its flattened spatial positions."""
    r = x.type.rank
    strides: list[Value] = []
    acc = a.ints(1)
    for axis in range(r - 1, 1, -1):
        strides.insert(0, acc)
        acc = a.mul(acc, a.dim(x, axis))
    return strides


def combine(a: Arith, rows: Value, axes: Sequence[Sequence[Tap]], strides: Sequence[Value],
            batch_dims: int, base: Value | None = None, reduce: str = "add") -> Value:
    """The weighted sum (``reduce="max"``: the largest weighted value), over every combination of one
    tap per axis, of the rows of ``rows`` at the combined flat index (plus ``base``).  The taps' values end in an axis of size 1 (gather_nd's index
    depth, then broadcast over the channels): the result has their shape with the channels last."""
    total: Value | None = None
    for combo in itertools.product(*axes):
        flat = base
        for tap, stride in zip(combo, strides):
            term = a.mul(tap.index, stride)
            flat = term if flat is None else a.add(flat, term)
        assert flat is not None
        got = a.gather_nd(rows, flat, batch_dims)
        weights = [t.weight for t in combo if t.weight is not None]
        if weights:
            w = weights[0]
            for extra in weights[1:]:
                w = a.mul(w, extra)
            got = a.mul(got, w)
        flags = [t.inside for t in combo if t.inside is not None]
        if flags:
            ok = flags[0]
            for extra in flags[1:]:
                ok = a.and_(ok, extra)
            got = a.where(ok, got, 0.0)
        total = got if total is None else a.op(reduce, total, got)
    assert total is not None
    return total


# GridSample ------------------------------------------------------------------------------------

_GRID_MODES = {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}
_GRID_MODES_16 = {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"}
_PADDING_MODES = ("zeros", "border", "reflection")


def _reflect(a: Arith, c: Value, lo: Value, hi: Value) -> Value:
    """``c`` reflected at ``lo`` and ``hi`` until it lies between them (ONNX's ``_gs_reflect``)."""
    span = a.max(a.sub(hi, lo), 1.0)  # the span is >= 1 for every axis of size >= 1
    below = a.less(c, lo)
    dist = a.where(below, a.sub(lo, c), a.sub(c, hi))
    n = a.floor(a.div(dist, span))
    rem = a.sub(dist, a.mul(n, span))
    even = a.equal(a.op("mod", n, a.v(2.0, n), fmod=0), 0.0)
    up, down = a.add(lo, rem), a.sub(hi, rem)
    reflected = a.where(below, a.where(even, up, down), a.where(even, down, up))
    outside = a.or_(below, a.greater(c, hi))
    return a.where(outside, reflected, c)


class _GridAxis:
    """The coordinate arithmetic of one spatial axis of GridSample."""

    def __init__(self, a: Arith, size: Value, align: bool, padding: str) -> None:
        self.a = a
        self.size_i = size
        self.size = a.cast(size, a.dtype)
        self.last_i = a.sub(size, 1)
        self.last = a.sub(self.size, 1.0)
        self.align = align
        self.padding = padding
        self.lo = a.v(0.0) if align else a.v(-0.5)
        self.hi = self.last if align else a.sub(self.size, 0.5)

    def coordinate(self, g: Value, nearest: bool) -> Value:
        a = self.a
        if self.align:
            c = a.mul(a.div(a.add(g, 1.0), 2.0), self.last)
        else:
            c = a.div(a.sub(a.mul(a.add(g, 1.0), self.size), 1.0), 2.0)
        if nearest:
            c = a.round(c)
        if self.padding == "border":
            outside = a.or_(a.less(c, self.lo), a.greater(c, self.hi))
            c = a.where(outside, a.clip(c, 0.0, self.last), c)
        elif self.padding == "reflection":
            c = _reflect(a, c, self.lo, self.hi)
        return c

    def tap(self, i: Value, weight: Value | None) -> Tap:
        """The tap at integral position ``i`` (a float), made valid by the padding rule."""
        a = self.a
        if self.padding == "zeros":
            inside = a.and_(a.greater_equal(i, 0.0), a.less(i, self.size))
            index = a.cast(a.where(inside, i, 0.0), DType.i64)
            return Tap(index, weight, inside)
        if self.padding == "reflection":
            i = _reflect(a, i, self.lo, self.hi)
        index = a.clip(a.cast(i, DType.i64), 0, self.last_i)
        return Tap(index, weight)

    def taps(self, c: Value, mode: str) -> list[Tap]:
        a = self.a
        if mode == "nearest":
            return [self.tap(c, None)]
        f = a.floor(c)
        t = a.sub(c, f)
        if mode == "linear":
            return [self.tap(f, a.sub(1.0, t)), self.tap(a.add(f, 1.0), t)]
        return [self.tap(a.add(f, float(k)), w) for k, w in zip((-1, 0, 1, 2), _cubic_weights(a, t))]


def _cubic_weights(a: Arith, t: Value) -> list[Value]:
    """Keys' cubic convolution weights of the four taps at offsets -1, 0, 1, 2 from ``floor(c)``."""
    A = _CUBIC_A

    def outer(s: Value) -> Value:  # |s| in [1, 2]
        return a.sub(a.mul(a.add(a.mul(a.sub(a.mul(s, A), 5 * A), s), 8 * A), s), 4 * A)

    def inner(s: Value) -> Value:  # |s| in [0, 1]
        return a.add(a.mul(a.mul(a.sub(a.mul(s, A + 2), A + 3), s), s), 1.0)

    u = a.sub(1.0, t)
    return [outer(a.add(t, 1.0)), inner(t), inner(u), outer(a.add(u, 1.0))]


@importer("GridSample", since=16)
def _grid_sample(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("align_corners", "mode", "padding_mode"))
    x, grid = ctx.input(0), ctx.input(1)
    if x is None or grid is None:
        raise ctx.fail("inputs X and grid are required")
    modes = _GRID_MODES if ctx.opset >= 20 else _GRID_MODES_16
    mode_name = str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    if mode_name not in modes:
        raise ctx.unsupported(f"mode={mode_name!r} (GridSample-{ctx.opset} has {', '.join(modes)})")
    mode = modes[mode_name]
    padding = str(ctx.attr("padding_mode", "zeros"))
    if padding not in _PADDING_MODES:
        raise ctx.unsupported(f"padding_mode={padding!r} (GridSample has {', '.join(_PADDING_MODES)})")
    align = int(ctx.attr("align_corners", 0))
    if align not in (0, 1):
        raise ctx.fail(f"align_corners must be 0 or 1, got {align}")
    if x.type.dtype not in FLOATS or grid.type.dtype not in FLOATS:
        raise ctx.unsupported(f"X of type {x.type.dtype} and grid of type {grid.type.dtype} "
                              "(floating-point X and grid are supported)")
    r = x.type.rank - 2
    if r < 1 or grid.type.rank != r + 2:
        raise ctx.fail(f"X {x.type} needs rank 3 or more and grid rank X's, got grid {grid.type}")
    if ctx.opset < 20 and r != 2:
        raise ctx.fail(f"GridSample-{ctx.opset} takes 4-D X, got {x.type}")
    last = grid.type.shape[-1]
    if isinstance(last, int) and last != r:
        raise ctx.fail(f"grid's last dim must be the number of spatial axes ({r}), got {grid.type}")
    a = Arith(ctx, compute_type(x, grid))
    g = a.cast(grid, a.dtype)
    rows = channels_last(a, x)
    strides = spatial_strides(a, x)
    axes: list[list[Tap]] = []
    for d in range(r):  # X's spatial axis d is the grid's component r-1-d (x, y, z run backwards)
        axis = _GridAxis(a, a.dim(x, 2 + d), bool(align), padding)
        coord = axis.coordinate(a.gather(g, [r - 1 - d], axis=-1), mode == "nearest")  # [N, *out, 1]
        axes.append(axis.taps(coord, mode))
    y = combine(a, rows, axes, strides, batch_dims=1)  # [N, *out, C]
    y = a.transpose(y, [0, r + 1, *range(1, r + 1)])
    return [a.cast(y, x.type.dtype)]


# RoiAlign --------------------------------------------------------------------------------------


def _roi_taps(a: Arith, c: Value, size: Value) -> list[Tap]:
    """The two taps of one axis at sample coordinates ``c`` (ONNX's ``pre_calc_for_bilinear_interpolate``):
    a sample beyond ``[-1, size]`` reads nothing; the others are clamped into the axis."""
    size_f = a.cast(size, a.dtype)
    last = a.sub(size_f, 1.0)
    inside = a.and_(a.greater_equal(c, -1.0), a.op("less_or_equal", c, size_f))
    c = a.max(c, 0.0)
    low = a.floor(c)
    at_end = a.greater_equal(low, last)
    low = a.where(at_end, last, low)
    high = a.where(at_end, last, a.add(low, 1.0))
    c = a.where(at_end, low, c)
    frac = a.sub(c, low)
    return [Tap(a.cast(low, DType.i64), a.sub(1.0, frac), inside), Tap(a.cast(high, DType.i64), frac, inside)]


@importer("RoiAlign", since=10)
def _roi_align(ctx: ImportCtx) -> Sequence[Value | None]:
    known = ["mode", "output_height", "output_width", "sampling_ratio", "spatial_scale"]
    if ctx.opset >= 16:
        known.append("coordinate_transformation_mode")
    known_attrs(ctx, known)
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    if x is None or rois is None or batch is None:
        raise ctx.fail("inputs X, rois and batch_indices are required")
    ctm = str(ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel"))
    if ctm not in ("half_pixel", "output_half_pixel"):
        raise ctx.unsupported(f"coordinate_transformation_mode={ctm!r} (RoiAlign has half_pixel and output_half_pixel)")
    mode = str(ctx.attr("mode", "avg"))
    if mode not in ("avg", "max"):
        raise ctx.unsupported(f"mode={mode!r} (RoiAlign has avg and max)")
    oh, ow = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    if oh < 1 or ow < 1:
        raise ctx.fail(f"output_height and output_width must be positive, got {oh} and {ow}")
    ratio = int(ctx.attr("sampling_ratio", 0))
    if ratio < 0:
        raise ctx.fail(f"sampling_ratio must not be negative, got {ratio}")
    if ratio == 0:
        raise ctx.unsupported("sampling_ratio=0 (an adaptive number of samples per bin, which each ROI's size "
                              "sets at run time); a positive sampling_ratio is supported")
    scale = float(ctx.attr("spatial_scale", 1.0))
    if x.type.dtype not in FLOATS or rois.type.dtype not in FLOATS:
        raise ctx.unsupported(f"X of type {x.type.dtype} and rois of type {rois.type.dtype} (floating-point "
                              "X and rois are supported)")
    if x.type.rank != 4 or rois.type.rank != 2 or batch.type.rank != 1:
        raise ctx.fail(f"X must be 4-D, rois 2-D and batch_indices 1-D, got {x.type}, {rois.type}, {batch.type}")
    if isinstance(rois.type.shape[1], int) and rois.type.shape[1] != 4:
        raise ctx.fail(f"rois must be [num_rois, 4], got {rois.type}")
    half = ctm == "half_pixel"
    a = Arith(ctx, compute_type(x, rois))
    box = a.cast(rois, a.dtype)
    # [R, 1, 1, 1] each: the ROI's corners in input pixels
    x1, y1, x2, y2 = (a.reshape(a.sub(a.mul(a.gather(box, [k], axis=1), scale), 0.5 if half else 0.0),
                                [-1, 1, 1, 1]) for k in range(4))
    roi_w, roi_h = a.sub(x2, x1), a.sub(y2, y1)
    if not half:
        roi_w, roi_h = a.max(roi_w, 1.0), a.max(roi_h, 1.0)
    bin_h, bin_w = a.div(roi_h, float(oh)), a.div(roi_w, float(ow))
    ph = a.const(np.arange(oh, dtype=np.float64).reshape(1, oh, 1, 1))
    pw = a.const(np.arange(ow, dtype=np.float64).reshape(1, 1, ow, 1))
    height, width = a.dim(x, 2), a.dim(x, 3)
    rows = a.reshape(channels_last(a, x), a.concat([a.ints([-1]), a.shape(x, 1, 2)]))  # [N*H*W, C]
    base = a.reshape(a.mul(a.cast(batch, DType.i64), a.mul(height, width)), [-1, 1, 1, 1])
    strides = [width, a.ints(1)]
    samples: list[Value] = []
    for iy in range(ratio):
        ys = a.add(a.add(y1, a.mul(ph, bin_h)), a.mul(bin_h, (iy + 0.5) / ratio))  # [R, oh, 1, 1]
        y_taps = _roi_taps(a, ys, height)
        for ix in range(ratio):
            xs = a.add(a.add(x1, a.mul(pw, bin_w)), a.mul(bin_w, (ix + 0.5) / ratio))  # [R, 1, ow, 1]
            samples.append(combine(a, rows, [y_taps, _roi_taps(a, xs, width)], strides, 0, base,
                                   "add" if mode == "avg" else "max"))
    if mode == "avg":
        y = a.div(a.sum_all(samples), float(ratio * ratio))
    else:
        y = samples[0]
        for s_ in samples[1:]:
            y = a.max(y, s_)
    return [a.cast(a.transpose(y, [0, 3, 1, 2]), x.type.dtype)]

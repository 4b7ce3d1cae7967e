"""Ops that read their input over computed regions: ``grid_sample``, ``roi_align``, ``max_roi_pool``,
``deform_conv``.

Semantics are ONNX's (GridSample-22, RoiAlign-16), step for step as ONNX's reference
implementations compute them, in float64:

* ``grid_sample``: the grid's normalized coordinates (x, y[, z], innermost axis first) are
  denormalized (``align_corners`` or not), rounded half to even for ``nearest``, and, when
  they fall outside the input's border, clamped (``border``) or reflected (``reflection``);
  then ``nearest``, ``linear`` or ``cubic`` (Keys, a = -0.75) taps are read, each tap
  outside the input reading 0 (``zeros``), the edge (``border``) or its reflection.
  Any number of spatial axes.
* ``roi_align``: each region's ``output_height x output_width`` bins average (``avg``) or
  take the largest (``max``, of the four weighted corner values, as onnxruntime defines it)
  of a grid of bilinear samples: ``sampling_ratio`` per bin side, or, when 0,
  ``ceil(roi size / bins)`` for each region.  A sample beyond one pixel outside the input
  reads 0.
* ``max_roi_pool``: the maximum over each of ``pooled_shape`` bins of each region, its corners
  scaled and rounded half away from zero, as onnxruntime computes it (ONNX's reference has none);
  an empty bin gives 0.
* ``deform_conv``: a 2-D convolution whose every kernel tap reads the input bilinearly (taps
  outside read 0) at its place plus a per-position offset, times an optional mask.

The references are vectorized: interpolation is separable, so each spatial axis gives every
output position a few taps (a valid index, a weight, for zero padding an inside flag).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from cuvil.ir.dtypes import FLOATS, INTS
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType
from cuvil.ops.conv import WindowAttrs, concrete, window_attrs, window_out_dim
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

GRID_MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
ROI_MODES = ("avg", "max")
ROI_COORD_MODES = ("half_pixel", "output_half_pixel")
CUBIC_A = -0.75

Taps = list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]  # (index, weight, inside)


def _check_choice(ctx: InferCtx, name: str, allowed: Sequence[str]) -> None:
    if ctx.attrs[name] not in allowed:
        raise ctx.fail(f"{name} {ctx.attrs[name]!r} is not one of {', '.join(allowed)}")


# grid_sample ------------------------------------------------------------------------------------


def _grid_infer(ctx: InferCtx) -> list[TensorType]:
    x, grid = ctx.type(0), ctx.type(1)
    ctx.require_dtype(0, FLOATS)
    ctx.require_dtype(1, FLOATS)
    _check_choice(ctx, "mode", GRID_MODES)
    _check_choice(ctx, "padding_mode", PADDING_MODES)
    if ctx.attrs["align_corners"] not in (0, 1):
        raise ctx.fail(f"align_corners must be 0 or 1, got {ctx.attrs['align_corners']}")
    r = x.rank - 2
    if r < 1 or grid.rank != x.rank:
        raise ctx.fail(f"X needs rank 3 or more and grid X's rank, got X {x} and grid {grid}")
    ctx.assume_equal(grid.shape[0], x.shape[0], "batch sizes of X and grid")
    ctx.assume_equal(grid.shape[-1], r, "grid's last dim and X's number of spatial axes")
    return [TensorType(x.dtype, (x.shape[0], x.shape[1], *grid.shape[1:-1]))]


def reflect(c: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``c`` reflected at ``lo`` and ``hi`` until it lies between them (ONNX's ``_gs_reflect``)."""
    span = max(hi - lo, 1.0)  # >= 1 for every axis of size >= 1 (0 only for a 1-pixel axis with align_corners)
    below = c < lo
    dist = np.where(below, lo - c, c - hi)
    n = np.floor(dist / span)
    rem = dist - n * span
    even = np.mod(n, 2) == 0
    up, down = lo + rem, hi - rem
    out = np.where(below, np.where(even, up, down), np.where(even, down, up))
    return np.where(below | (c > hi), out, c)


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    a = CUBIC_A

    def outer(s: np.ndarray) -> np.ndarray:
        return np.asarray(((a * s - 5 * a) * s + 8 * a) * s - 4 * a)

    def inner(s: np.ndarray) -> np.ndarray:
        return np.asarray(((a + 2) * s - (a + 3)) * s * s + 1)

    return [outer(t + 1), inner(t), inner(1 - t), outer(2 - t)]


def _grid_axis_taps(g: np.ndarray, size: int, mode: str, padding: str, align: bool) -> Taps:
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    c = (g + 1) / 2 * (size - 1) if align else ((g + 1) * size - 1) / 2
    if mode == "nearest":
        c = np.round(c)
    if padding == "border":
        c = np.where((c < lo) | (c > hi), np.clip(c, 0, size - 1), c)
    elif padding == "reflection":
        c = reflect(c, lo, hi)

    def tap(i: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        if padding == "zeros":
            inside = (i >= 0) & (i < size)
            return np.where(inside, i, 0).astype(np.int64), w, inside
        if padding == "reflection":
            i = reflect(i, lo, hi)
        with np.errstate(invalid="ignore"):
            return np.clip(np.nan_to_num(i).astype(np.int64), 0, size - 1), w, None

    if mode == "nearest":
        return [tap(c, None)]
    f = np.floor(c)
    t = c - f
    if mode == "linear":
        return [tap(f, 1 - t), tap(f + 1, t)]
    return [tap(f + k, w) for k, w in zip((-1, 0, 1, 2), _cubic_weights(t))]


def _combine(data: np.ndarray, axes: Sequence[Taps], reduce: str = "add") -> np.ndarray:
    """Σ (or max) over one tap per axis of weight * data[..., i_1, ..., i_r] (0 for a tap outside).

    ``data`` is [B, *spatial, C]; the taps broadcast against [B, *out]; the result is [B, *out, C]."""
    total: np.ndarray | None = None
    b = np.arange(data.shape[0]).reshape((-1,) + (1,) * (np.ndim(axes[0][0][0]) - 1))
    for combo in itertools.product(*axes):
        got = data[(b, *(idx for idx, _, _ in combo))]
        w = math.prod(wt for _, wt, _ in combo if wt is not None)
        got = got * (w[..., None] if isinstance(w, np.ndarray) else w)
        flags = [f for _, _, f in combo if f is not None]
        if flags:
            got = np.where(functools.reduce(np.logical_and, flags)[..., None], got, 0.0)
        total = got if total is None else (total + got if reduce == "add" else np.maximum(total, got))
    assert total is not None
    return total


def _grid_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, grid = ctx.input(0).astype(np.float64), ctx.input(1).astype(np.float64)
    r = x.ndim - 2
    if grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
        raise ValueError(f"grid_sample: grid {list(grid.shape)} does not fit X {list(x.shape)}")
    mode, padding, align = ctx.attrs["mode"], ctx.attrs["padding_mode"], bool(ctx.attrs["align_corners"])
    axes = [_grid_axis_taps(grid[..., r - 1 - d], x.shape[2 + d], mode, padding, align) for d in range(r)]
    with np.errstate(invalid="ignore", over="ignore"):
        y = _combine(np.moveaxis(x, 1, -1), axes)  # [N, *out, C]
    return [np.moveaxis(y, -1, 1).astype(ctx.out_dtype())]


register(
    OpDef(
        name="grid_sample",
        inputs=("X", "grid"),
        attrs={"mode": AttrSpec("str", "linear"), "padding_mode": AttrSpec("str", "zeros"),
               "align_corners": AttrSpec("int", 0)},
        infer=_grid_infer,
        reference=_grid_ref,
        tolerance=1e-4,
        doc="Samples X [N, C, *in] at the grid's normalized positions [N, *out, r] (ONNX GridSample): "
        "mode nearest|linear|cubic, padding_mode zeros|border|reflection.",
    )
)


# roi_align -----------------------------------------------------------------------------------------


def _roi_infer(ctx: InferCtx) -> list[TensorType]:
    x, rois, batch = ctx.type(0), ctx.type(1), ctx.type(2)
    ctx.require_dtype(0, FLOATS)
    ctx.require_dtype(1, FLOATS)
    ctx.require_dtype(2, INTS)
    _check_choice(ctx, "mode", ROI_MODES)
    _check_choice(ctx, "coordinate_transformation_mode", ROI_COORD_MODES)
    oh, ow, ratio = (int(ctx.attrs[k]) for k in ("output_height", "output_width", "sampling_ratio"))
    if oh < 1 or ow < 1 or ratio < 0:
        raise ctx.fail(f"output_height and output_width must be positive and sampling_ratio not negative, "
                       f"got {oh}, {ow}, {ratio}")
    if x.rank != 4 or rois.rank != 2 or batch.rank != 1:
        raise ctx.fail(f"X must be 4-D, rois 2-D and batch_indices 1-D, got {x}, {rois}, {batch}")
    ctx.assume_equal(rois.shape[1], 4, "rois' last dim and 4")
    ctx.assume_equal(batch.shape[0], rois.shape[0], "numbers of rois and batch indices")
    n: Dim = rois.shape[0]
    return [TensorType(x.dtype, (n, x.shape[1], oh, ow))]


def _roi_axis_taps(c: np.ndarray, size: int) -> Taps:
    """The two taps of one axis at sample coordinates ``c`` (ONNX's ``pre_calc_for_bilinear_interpolate``)."""
    inside = (c >= -1.0) & (c <= size)
    c = np.maximum(c, 0.0)
    low = np.floor(c)
    at_end = low >= size - 1
    low = np.where(at_end, size - 1, low)
    high = np.where(at_end, size - 1, low + 1)
    c = np.where(at_end, low, c)
    frac = c - low
    return [(low.astype(np.int64), 1 - frac, inside), (high.astype(np.int64), frac, inside)]


def _roi_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0).astype(np.float64)
    rois, batch = ctx.input(1).astype(np.float64), ctx.input(2).astype(np.int64)
    if rois.ndim != 2 or rois.shape[1] != 4 or batch.shape != (rois.shape[0],):
        raise ValueError(f"roi_align: rois {list(rois.shape)} and batch_indices {list(batch.shape)} do not fit")
    n, _, height, width = x.shape
    if ((batch < 0) | (batch >= n)).any():
        raise IndexError(f"roi_align: batch index {int(batch[(batch < 0) | (batch >= n)][0])} is out of range "
                         f"for a batch of {n}")
    oh, ow, ratio = (int(ctx.attrs[k]) for k in ("output_height", "output_width", "sampling_ratio"))
    half = ctx.attrs["coordinate_transformation_mode"] == "half_pixel"
    scale, use_max = float(ctx.attrs["spatial_scale"]), ctx.attrs["mode"] == "max"
    out = np.zeros((rois.shape[0], x.shape[1], oh, ow))
    for i, (box, b) in enumerate(zip(rois, batch)):
        x1, y1, x2, y2 = box * scale - (0.5 if half else 0.0)
        rw, rh = x2 - x1, y2 - y1
        if not half:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = ratio if ratio > 0 else max(math.ceil(rh / oh), 0)
        gw = ratio if ratio > 0 else max(math.ceil(rw / ow), 0)
        # sample coordinates: [oh, gh] rows, [ow, gw] columns
        ys = y1 + np.arange(oh)[:, None] * bh + (np.arange(gh)[None, :] + 0.5) * bh / gh
        xs = x1 + np.arange(ow)[:, None] * bw + (np.arange(gw)[None, :] + 0.5) * bw / gw
        y_taps: Taps = [(idx.reshape(1, oh, gh, 1, 1), w.reshape(1, oh, gh, 1, 1), f.reshape(1, oh, gh, 1, 1))
                        for idx, w, f in _roi_axis_taps(ys, height) if w is not None and f is not None]
        x_taps: Taps = [(idx.reshape(1, 1, 1, ow, gw), w.reshape(1, 1, 1, ow, gw), f.reshape(1, 1, 1, ow, gw))
                        for idx, w, f in _roi_axis_taps(xs, width) if w is not None and f is not None]
        data = np.moveaxis(x[b : b + 1], 1, -1)  # [1, H, W, C]
        got = _combine(data, [y_taps, x_taps], "max" if use_max else "add")[0]  # [oh, gh, ow, gw, C]
        if gh * gw == 0:
            pooled = np.zeros((oh, ow, x.shape[1]))
        elif use_max:
            pooled = got.max(axis=(1, 3))
        else:
            pooled = got.sum(axis=(1, 3)) / (gh * gw)
        out[i] = np.moveaxis(pooled, -1, 0)
    return [out.astype(ctx.out_dtype())]


register(
    OpDef(
        name="roi_align",
        inputs=("X", "rois", "batch_indices"),
        attrs={"mode": AttrSpec("str", "avg"), "output_height": AttrSpec("int", 1),
               "output_width": AttrSpec("int", 1), "sampling_ratio": AttrSpec("int", 0),
               "spatial_scale": AttrSpec("float", 1.0),
               "coordinate_transformation_mode": AttrSpec("str", "half_pixel")},
        infer=_roi_infer,
        reference=_roi_ref,
        tolerance=1e-4,
        doc="Pools each region of interest [x1, y1, x2, y2] of image batch_indices[i] of X into "
        "output_height x output_width bins of bilinear samples (ONNX RoiAlign): mode avg|max.",
    )
)

# deform_conv ---------------------------------------------------------------------------------------


def _deform_geometry(ctx: InferCtx | RefCtx) -> tuple[WindowAttrs, int, int]:
    w = window_attrs(ctx, 2)
    group, og = int(ctx.attrs["group"]), int(ctx.attrs["offset_group"])
    if group < 1 or og < 1:
        raise ValueError(f"{ctx.op}: group ({group}) and offset_group ({og}) must be positive")
    return w, group, og


def _deform_infer(ctx: InferCtx) -> list[TensorType]:
    x, wt, off = ctx.type(0), ctx.type(1), ctx.type(2)
    dt = ctx.same_dtype(0, 1, 2, 3, 4)
    ctx.require_dtype(0, FLOATS)
    if x.rank != 4 or wt.rank != 4 or off.rank != 4:
        raise ctx.fail(f"X, W and offset must be 4-D (2 spatial axes), got {x}, {wt}, {off}")
    try:
        w, group, og = _deform_geometry(ctx)
    except ValueError as exc:
        raise ctx.fail(str(exc).removeprefix(f"{ctx.op}: ")) from None
    ks = ctx.attrs["kernel_shape"]
    kernel: list[Dim] = list(wt.shape[2:])
    if ks is not None:
        if len(ks) != 2:
            raise ctx.fail(f"kernel_shape must have 2 values, got {list(ks)}")
        kernel = [int(v) for v in ks]
        for i in range(2):
            ctx.assume_equal(wt.shape[2 + i], kernel[i], "W's spatial dims and kernel_shape")
    ctx.assume_equal(x.shape[1], wt.shape[1] * group, "X's channels and W's input channels x group")
    if isinstance(wt.shape[0], int) and wt.shape[0] % group:
        raise ctx.fail(f"W's output channels ({wt.shape[0]}) must be a multiple of group ({group})")
    if isinstance(x.shape[1], int) and x.shape[1] % og:
        raise ctx.fail(f"X's channels ({x.shape[1]}) must be a multiple of offset_group ({og})")
    out = [window_out_dim(x.shape[2 + i], kernel[i], i, w) for i in range(2)]
    ctx.assume_equal(off.shape[0], x.shape[0], "batch sizes of offset and X")
    ctx.assume_equal(off.shape[1], kernel[0] * kernel[1] * 2 * og, "offset channels and 2 x kernel taps x offset_group")
    for i in range(2):
        ctx.assume_equal(off.shape[2 + i], out[i], "offset's spatial dims and the output's")
    if ctx.has(3):
        b = ctx.type(3)
        if b.rank != 1:
            raise ctx.fail(f"B must be 1-D, got {b}")
        ctx.assume_equal(b.shape[0], wt.shape[0], "B's length and W's output channels")
    if ctx.has(4):
        m = ctx.type(4)
        if m.rank != 4:
            raise ctx.fail(f"mask must be 4-D, got {m}")
        ctx.assume_equal(m.shape[1], kernel[0] * kernel[1] * og, "mask channels and kernel taps x offset_group")
    return [TensorType(dt, (x.shape[0], wt.shape[0], *out))]


def _deform_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, wt, off = (ctx.input(i).astype(np.float64) for i in range(3))
    w, group, og = _deform_geometry(ctx)
    n, ic, ih, iw = x.shape
    oc, icg, kh, kw = wt.shape
    oh, ow = (concrete(window_out_dim(x.shape[2 + i], wt.shape[2 + i], i, w)) for i in range(2))
    if ic != icg * group or oc % group or ic % og or off.shape != (n, og * kh * kw * 2, oh, ow):
        raise ValueError(f"deform_conv: X {list(x.shape)}, W {list(wt.shape)} and offset {list(off.shape)} do not fit")
    off = off.reshape(n, og, kh, kw, 2, oh, ow)
    mask = ctx.input(4).astype(np.float64).reshape(n, og, kh, kw, oh, ow) if ctx.has(4) else None
    # sample positions [n, og, kh, kw, oh, ow]
    hs = (np.arange(oh) * w.strides[0] - w.pads_begin[0])[None, None, None, None, :, None] + \
        (np.arange(kh) * w.dilations[0])[None, None, :, None, None, None] + off[:, :, :, :, 0]
    ws = (np.arange(ow) * w.strides[1] - w.pads_begin[1])[None, None, None, None, None, :] + \
        (np.arange(kw) * w.dilations[1])[None, None, None, :, None, None] + off[:, :, :, :, 1]
    h0, w0 = np.floor(hs), np.floor(ws)
    grid = np.moveaxis(x.reshape(n, og, ic // og, ih, iw), 2, -1)  # [n, og, ih, iw, ic/og]
    bi = np.arange(n).reshape(n, 1, 1, 1, 1, 1)
    gi = np.arange(og).reshape(1, og, 1, 1, 1, 1)
    cols = np.zeros((n, og, kh, kw, oh, ow, ic // og))
    for dh_, dw_ in itertools.product((0, 1), (0, 1)):
        hi, wi = h0 + dh_, w0 + dw_
        weight = (1 - np.abs(hs - hi)) * (1 - np.abs(ws - wi))
        inside = (hi >= 0) & (hi < ih) & (wi >= 0) & (wi < iw)
        got = grid[bi, gi, np.where(inside, hi, 0).astype(np.int64), np.where(inside, wi, 0).astype(np.int64)]
        cols += np.where(inside, weight, 0.0)[..., None] * got
    if mask is not None:
        cols *= mask[..., None]
    cols = np.moveaxis(cols, -1, 2).reshape(n, group, icg, kh, kw, oh, ow)
    y = np.einsum("ngcabij,gocab->ngoij", cols, wt.reshape(group, oc // group, icg, kh, kw)).reshape(n, oc, oh, ow)
    if ctx.has(3):
        y = y + ctx.input(3).astype(np.float64).reshape(1, oc, 1, 1)
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="deform_conv",
        inputs=("X", "W", "offset", "B?", "mask?"),
        attrs={"dilations": AttrSpec("ints", None), "group": AttrSpec("int", 1), "kernel_shape": AttrSpec("ints", None),
               "offset_group": AttrSpec("int", 1), "pads": AttrSpec("ints", None), "strides": AttrSpec("ints", None)},
        infer=_deform_infer,
        reference=_deform_ref,
        tolerance=1e-4,
        doc="2-D deformable convolution (ONNX DeformConv): each kernel tap reads X bilinearly (zero outside) at "
        "its position plus a learned offset, scaled by mask.",
    )
)

# max_roi_pool -----------------------------------------------------------------------------------------


def _pool_infer(ctx: InferCtx) -> list[TensorType]:
    x, rois = ctx.type(0), ctx.type(1)
    ctx.same_dtype(0, 1)
    ctx.require_dtype(0, FLOATS)
    shape = [int(v) for v in ctx.attrs["pooled_shape"]]
    if len(shape) != 2 or min(shape) < 1:
        raise ctx.fail(f"pooled_shape must be two positive values, got {shape}")
    if x.rank != 4 or rois.rank != 2:
        raise ctx.fail(f"X must be 4-D and rois [num_rois, 5], got {x} and {rois}")
    ctx.assume_equal(rois.shape[1], 5, "rois' last dim and 5 (batch index, x1, y1, x2, y2)")
    return [TensorType(x.dtype, (rois.shape[0], x.shape[1], *shape))]


def roi_pool_bins(start: int, end: int, pooled: int, size: int) -> list[tuple[int, int]]:
    """The [begin, end) of each of ``pooled`` bins over the ROI's ``start..end`` (inclusive) pixels, clamped."""
    length = max(end - start + 1, 1)
    step = np.float32(length) / np.float32(pooled)
    out = []
    for p in range(pooled):
        lo = int(np.floor(np.float32(p) * step)) + start
        hi = int(np.ceil(np.float32(p + 1) * step)) + start
        out.append((min(max(lo, 0), size), min(max(hi, 0), size)))
    return out


def round_half_away(v: float) -> int:
    return math.floor(abs(v) + 0.5) * (1 if v >= 0 else -1)


def _pool_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, rois = ctx.input(0), ctx.input(1).astype(np.float32)
    ph, pw = (int(v) for v in ctx.attrs["pooled_shape"])
    scale = np.float32(ctx.attrs["spatial_scale"])
    n, c, height, width = x.shape
    if rois.ndim != 2 or rois.shape[1] != 5:
        raise ValueError(f"max_roi_pool: rois must be [num_rois, 5], got {list(rois.shape)}")
    out = np.zeros((rois.shape[0], c, ph, pw), dtype=x.dtype)
    for r, roi in enumerate(rois):
        b = int(roi[0])
        if not 0 <= b < n:
            raise IndexError(f"max_roi_pool: batch index {b} is out of range for a batch of {n}")
        x1, y1, x2, y2 = (round_half_away(float(v * scale)) for v in roi[1:])
        for i, (h0, h1) in enumerate(roi_pool_bins(y1, y2, ph, height)):
            for j, (w0, w1) in enumerate(roi_pool_bins(x1, x2, pw, width)):
                if h1 > h0 and w1 > w0:
                    out[r, :, i, j] = x[b, :, h0:h1, w0:w1].max(axis=(1, 2))
    return [out]


register(
    OpDef(
        name="max_roi_pool",
        inputs=("X", "rois"),
        attrs={"pooled_shape": AttrSpec("ints"), "spatial_scale": AttrSpec("float", 1.0)},
        infer=_pool_infer,
        reference=_pool_ref,
        doc="The maximum of X over each bin of each region [batch, x1, y1, x2, y2] (ONNX MaxRoiPool): "
        "[num_rois, C, *pooled_shape]; an empty bin gives 0.",
    )
)

__all__ = ["CUBIC_A", "GRID_MODES", "PADDING_MODES", "ROI_COORD_MODES", "ROI_MODES", "reflect"]

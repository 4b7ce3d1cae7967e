"""The ``resize`` op (ONNX Resize-19 semantics): nearest, N-linear and N-cubic interpolation.

Inputs are ``X``, then the optional ``roi``, ``scales`` and ``sizes`` (exactly one of the last
two, possibly computed at run time).  Attributes follow ONNX: ``mode``, ``nearest_mode``,
``coordinate_transformation_mode``, ``cubic_coeff_a``, ``exclude_outside``,
``extrapolation_value``, ``antialias``, ``axes`` and ``keep_aspect_ratio_policy``.  The one
addition is the coordinate mode ``tf_half_pixel_for_nn`` of Resize-11/13, kept so that those
models import without a change of meaning.

Interpolation is separable: the reference builds, for each resized axis, a dense
``[out, in]`` weight matrix (each output position's taps, clamped to the edge as ONNX's
edge padding does) and contracts it with the data, axis by axis in float64.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cuvil.ir.dtypes import FLOATS, INTS, NUMERIC
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axes
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

MODES = ("nearest", "linear", "cubic")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
)
ASPECT_POLICIES = ("stretch", "not_larger", "not_smaller")


def _present(types: Sequence[TensorType | None], i: int) -> bool:
    """An optional 1-D input counts as given unless it is absent or statically empty (opset 11 idiom)."""
    t = types[i] if i < len(types) else None
    return t is not None and not (t.rank == 1 and t.shape[0] == 0)


def _check_attrs(attrs: dict[str, object], fail: type[Exception] | object) -> None:
    checks = (
        ("mode", MODES),
        ("nearest_mode", NEAREST_MODES),
        ("coordinate_transformation_mode", COORD_MODES),
        ("keep_aspect_ratio_policy", ASPECT_POLICIES),
    )
    for name, allowed in checks:
        if attrs[name] not in allowed:
            raise fail(f"{name} {attrs[name]!r} is not one of {', '.join(allowed)}")  # type: ignore[operator]
    for name in ("antialias", "exclude_outside"):
        if attrs[name] not in (0, 1):
            raise fail(f"{name} must be 0 or 1, got {attrs[name]}")  # type: ignore[operator]
    if attrs["antialias"] and attrs["mode"] == "nearest":
        raise fail("antialias applies to the linear and cubic modes only")  # type: ignore[operator]


def _axes(attrs: dict[str, object], rank: int, op: str) -> list[int]:
    axes = attrs["axes"]
    return list(range(rank)) if axes is None else normalize_axes(op, list(axes), rank)  # type: ignore[call-overload]


def _out_len_from_scale(size: Dim, scale: float, crop: float) -> Dim:
    """``floor(size * crop * scale)``, kept symbolic where that is exact."""
    if isinstance(size, int):
        return math.floor(size * crop * scale)
    factor = crop * scale
    if factor == int(factor) and factor >= 1:
        return size * int(factor)
    return UNKNOWN


def _policy_scale(policy: str, ratios: Sequence[float]) -> float:
    return min(ratios) if policy == "not_larger" else max(ratios)


def _resize_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, NUMERIC)
    _check_attrs(ctx.attrs, ctx.fail)
    x = ctx.type(0)
    axes = _axes(ctx.attrs, x.rank, ctx.op)
    has_scales, has_sizes = _present(ctx.types, 2), _present(ctx.types, 3)
    if has_scales == has_sizes:
        raise ctx.fail("exactly one of scales and sizes must be given")
    for i, what, dtypes in ((1, "roi", FLOATS), (2, "scales", FLOATS), (3, "sizes", INTS)):
        if not _present(ctx.types, i):
            continue
        ctx.require_dtype(i, dtypes)
        t = ctx.type(i)
        want = 2 * len(axes) if i == 1 else len(axes)
        if t.rank != 1 or (isinstance(t.shape[0], int) and t.shape[0] != want):
            raise ctx.fail(f"{what} must be 1-D with {want} values, got {t}")
    shape: list[Dim] = list(x.shape)
    crop = [1.0] * len(axes)
    if ctx.attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        if not _present(ctx.types, 1):
            raise ctx.fail("coordinate_transformation_mode tf_crop_and_resize needs roi")
        roi = ctx.const(1)
        if roi is None:
            crop = [math.nan] * len(axes)
        else:
            r = roi.astype(np.float64).reshape(-1)
            crop = [float(r[len(axes) + i] - r[i]) for i in range(len(axes))]
    if has_scales:
        scales = ctx.const(2)
        for i, a in enumerate(axes):
            if scales is None or math.isnan(crop[i]):
                shape[a] = UNKNOWN
                continue
            s = float(scales.reshape(-1)[i])
            if not s > 0:
                raise ctx.fail(f"scales must be positive, got {scales.reshape(-1).tolist()}")
            shape[a] = _out_len_from_scale(x.shape[a], s, crop[i])
        return [TensorType(x.dtype, tuple(shape))]
    sizes = ctx.const(3)
    policy = ctx.attrs["keep_aspect_ratio_policy"]
    if sizes is None:
        for a in axes:
            shape[a] = UNKNOWN
        return [TensorType(x.dtype, tuple(shape))]
    vals = [int(v) for v in sizes.reshape(-1)]
    if any(v < 0 for v in vals):
        raise ctx.fail(f"sizes must be non-negative, got {vals}")
    if policy == "stretch":
        for i, a in enumerate(axes):
            shape[a] = vals[i]
    else:
        known = [d for d in (x.shape[a] for a in axes) if isinstance(d, int) and d > 0]
        if len(known) == len(axes):
            scale = _policy_scale(policy, [vals[i] / known[i] for i in range(len(axes))])
            for i, a in enumerate(axes):
                shape[a] = int(scale * known[i] + 0.5)  # round half up, as ONNX specifies
        else:
            for a in axes:
                shape[a] = UNKNOWN
    return [TensorType(x.dtype, tuple(shape))]


# reference ---------------------------------------------------------------------------------------


def _source_coords(
    mode: str, out_len: int, in_len: int, scale: float, roi: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray | None]:
    """Each output index's position in the input (float64), and where tf_crop_and_resize extrapolates."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len  # the fractional target length ONNX's formulas use
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5, None
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5, None
    if mode == "pytorch_half_pixel":
        return ((y + 0.5) / scale - 0.5 if width > 1 else np.zeros_like(y)), None
    if mode == "align_corners":
        return (y * (in_len - 1) / (width - 1) if width != 1 else np.zeros_like(y)), None
    if mode == "asymmetric":
        return y / scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale, None
    start, end = roi
    if width != 1:
        x = start * (in_len - 1) + y * (end - start) * (in_len - 1) / (width - 1)
    else:
        x = np.full_like(y, 0.5 * (start + end) * (in_len - 1))
    return x, (x < 0) | (x > in_len - 1)


def _cubic(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


def _axis_weights(attrs: dict[str, object], x: np.ndarray, in_len: int, scale: float) -> np.ndarray:
    """The ``[out, in]`` interpolation matrix for source positions ``x``."""
    out_len = x.shape[0]
    w = np.zeros((out_len, in_len), dtype=np.float64)
    rows = np.arange(out_len)
    if attrs["mode"] == "nearest":
        nm = attrs["nearest_mode"]
        if nm == "round_prefer_floor":
            idx = np.ceil(x - 0.5)
        elif nm == "round_prefer_ceil":
            idx = np.floor(x + 0.5)
        elif nm == "floor":
            idx = np.floor(x)
        else:
            idx = np.ceil(x)
        w[rows, np.clip(idx, 0, in_len - 1).astype(np.int64)] = 1.0
        return w
    # Taps sit at base + j, with base = ceil(x) - 1 so that the fraction r lies in (0, 1], as in
    # ONNX's reference; antialiasing widens the kernel by 1 / scale when downsampling.
    base = np.ceil(x) - 1
    r = x - base
    support = 1 if attrs["mode"] == "linear" else 2
    stretch = min(scale, 1.0) if attrs["antialias"] else 1.0
    start = math.floor(-support / stretch) + 1
    j = np.arange(start, 2 - start, dtype=np.float64)
    t = (j[None, :] - r[:, None]) * stretch
    if attrs["mode"] == "linear":
        coef = np.clip(1 - np.abs(t), 0, 1)
    else:
        coef = _cubic(t, float(attrs["cubic_coeff_a"]))  # type: ignore[arg-type]
    if attrs["antialias"]:
        coef = coef / coef.sum(axis=1, keepdims=True)
    idx = (base[:, None] + j[None, :]).astype(np.int64)
    if attrs["exclude_outside"]:
        coef = np.where((idx < 0) | (idx >= in_len), 0.0, coef)
        total = coef.sum(axis=1, keepdims=True)
        coef = coef / np.where(total == 0, 1.0, total)
    np.add.at(w, (np.broadcast_to(rows[:, None], idx.shape), np.clip(idx, 0, in_len - 1)), coef)
    return w


def _plan(ctx: RefCtx, x: np.ndarray, axes: list[int]) -> tuple[list[float], list[int], list[tuple[float, float]]]:
    """Per resized axis: the scale, the output length and the roi (start, end)."""
    k = len(axes)
    roi = [(0.0, 1.0)] * k
    if ctx.has(1) and ctx.input(1).size > 0:
        r = ctx.input(1).astype(np.float64).reshape(-1)
        if r.size != 2 * k:
            raise ValueError(f"resize: roi has {r.size} values, expected {2 * k}")
        roi = [(float(r[i]), float(r[k + i])) for i in range(k)]
    tf_crop = ctx.attrs["coordinate_transformation_mode"] == "tf_crop_and_resize"
    scales_given = ctx.has(2) and ctx.input(2).size > 0
    if scales_given:
        scales = [float(s) for s in ctx.input(2).reshape(-1)]
        if len(scales) != k:
            raise ValueError(f"resize: scales has {len(scales)} values, expected {k}")
        crop = [(e - s) if tf_crop else 1.0 for s, e in roi]
        outs = [math.floor(x.shape[a] * crop[i] * scales[i]) for i, a in enumerate(axes)]
        return scales, outs, roi
    sizes = [int(s) for s in ctx.input(3).reshape(-1)]
    if len(sizes) != k:
        raise ValueError(f"resize: sizes has {len(sizes)} values, expected {k}")
    ratios = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
    policy = str(ctx.attrs["keep_aspect_ratio_policy"])
    if policy == "stretch":
        return ratios, sizes, roi
    scale = _policy_scale(policy, ratios)
    return [scale] * k, [int(scale * x.shape[a] + 0.5) for a in axes], roi


def _resize_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    _check_attrs(ctx.attrs, ValueError)
    axes = _axes(ctx.attrs, x.ndim, ctx.op)
    scales, outs, roi = _plan(ctx, x, axes)
    mode = str(ctx.attrs["coordinate_transformation_mode"])
    y = x.astype(np.float64)
    for i, a in enumerate(axes):
        in_len = x.shape[a]
        if outs[i] == in_len and scales[i] == 1.0 and (mode != "tf_crop_and_resize" or roi[i] == (0.0, 1.0)):
            continue  # the identity along this axis
        if in_len == 0 and outs[i] > 0:
            raise ValueError(f"resize: axis {a} is empty and cannot be resized to {outs[i]}")
        if outs[i] == 0:
            shape = list(y.shape)
            shape[a] = outs[i]
            y = np.zeros(shape, dtype=np.float64)
            continue
        src, outside = _source_coords(mode, outs[i], in_len, scales[i], roi[i])
        w = _axis_weights(ctx.attrs, src, in_len, scales[i])
        y = np.moveaxis(np.tensordot(w, y, axes=([1], [a])), 0, a)
        if outside is not None and outside.any():
            mask = outside.reshape((-1,) + (1,) * (y.ndim - a - 1))
            y = np.where(mask, float(ctx.attrs["extrapolation_value"]), y)
    dt = ctx.out_dtype()
    if dt.kind in "iu":
        info = np.iinfo(dt)
        y = np.clip(np.round(y), info.min, info.max)  # round half to even, then saturate
    return [np.ascontiguousarray(y).astype(dt)]


register(
    OpDef(
        name="resize",
        inputs=("X", "roi?", "scales?", "sizes?"),
        attrs={
            "antialias": AttrSpec("int", 0),
            "axes": AttrSpec("ints", None),
            "coordinate_transformation_mode": AttrSpec("str", "half_pixel"),
            "cubic_coeff_a": AttrSpec("float", -0.75),
            "exclude_outside": AttrSpec("int", 0),
            "extrapolation_value": AttrSpec("float", 0.0),
            "keep_aspect_ratio_policy": AttrSpec("str", "stretch"),
            "mode": AttrSpec("str", "nearest"),
            "nearest_mode": AttrSpec("str", "round_prefer_floor"),
        },
        infer=_resize_infer,
        reference=_resize_ref,
        tolerance=1e-4,
        doc="Nearest / N-linear / N-cubic resizing (ONNX Resize-19).",
    )
)

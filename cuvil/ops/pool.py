"""Pooling ops: ``max_pool`` (with its optional ``Indices``), ``average_pool``, ``global_max_pool``,
``global_average_pool``; N-d, on ONNX's ``[N, C, D1, ..., Dn]`` layout.

Window placement (strides, dilations, pads, ``auto_pad``, ``ceil_mode``) comes from the shared
sliding-window geometry in :mod:`cuvil.ops.conv`.  The references work on a strided view of the
padded input, so they run at NumPy speed whatever the image size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.conv import WindowAttrs, acc_dtype, concrete, resolve_pads, sliding_windows, window_attrs, window_out_dim
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

_WINDOW_ATTRS = {
    "auto_pad": AttrSpec("str", "NOTSET"),
    "ceil_mode": AttrSpec("int", 0),
    "dilations": AttrSpec("ints", None),
    "kernel_shape": AttrSpec("ints"),
    "pads": AttrSpec("ints", None),
    "strides": AttrSpec("ints", None),
}

MAX_POOL_DTYPES = FLOATS | {DType.i8, DType.u8}


def _kernel(ctx: InferCtx | RefCtx, n: int) -> tuple[int, ...]:
    ks = [int(k) for k in ctx.attrs["kernel_shape"]]
    if len(ks) != n or any(k < 1 for k in ks):
        message = f"kernel_shape {ks} must hold {n} positive values (one per spatial dim)"
        raise ctx.fail(message) if isinstance(ctx, InferCtx) else ValueError(f"{ctx.op}: {message}")
    return tuple(ks)


def _pool_infer(ctx: InferCtx, dtypes: frozenset[DType]) -> TensorType:
    ctx.require_dtype(0, dtypes)
    x = ctx.type(0)
    if x.rank < 3:
        raise ctx.fail(f"X must have rank >= 3 ([N, C, spatial...]), got {x}")
    n = x.rank - 2
    kernel = _kernel(ctx, n)
    w = window_attrs(ctx, n)
    ceil_mode = bool(ctx.attrs["ceil_mode"])
    for i in range(n):
        dk = (kernel[i] - 1) * w.dilations[i] + 1
        if w.pads_begin[i] >= dk or w.pads_end[i] >= dk:
            raise ctx.fail(f"pads {list(w.pads_begin + w.pads_end)} must be smaller than the kernel extent")
    spatial = [window_out_dim(x.shape[2 + i], kernel[i], i, w, ceil_mode) for i in range(n)]
    for d in spatial:
        if isinstance(d, int) and d < 1:
            raise ctx.fail(f"the kernel does not fit the input: output spatial size {spatial}")
    return TensorType(x.dtype, (*x.shape[:2], *spatial))


def _geometry(ctx: RefCtx, x: np.ndarray) -> tuple[tuple[int, ...], WindowAttrs, list[int], list[tuple[int, int]]]:
    n = x.ndim - 2
    kernel = _kernel(ctx, n)
    w = window_attrs(ctx, n)
    ceil_mode = bool(ctx.attrs["ceil_mode"])
    out = [concrete(window_out_dim(x.shape[2 + i], kernel[i], i, w, ceil_mode)) for i in range(n)]
    pads = [resolve_pads(x.shape[2 + i], kernel[i], i, w, out[i]) for i in range(n)]
    return kernel, w, out, pads


def _flat(win: np.ndarray, n: int) -> np.ndarray:
    """Windows ``[N, C, *out, *kernel]`` as ``[N, C, *out, taps]``."""
    # the taps counted, not -1: an empty batch leaves -1 ambiguous for NumPy
    return win.reshape(*win.shape[: 2 + n], math.prod(win.shape[2 + n :]))


# max_pool ---------------------------------------------------------------------------------------


def _max_pool_infer(ctx: InferCtx) -> list[TensorType]:
    y = _pool_infer(ctx, MAX_POOL_DTYPES)
    if ctx.attrs["storage_order"] not in (0, 1):
        raise ctx.fail(f"storage_order must be 0 (row major) or 1 (column major), got {ctx.attrs['storage_order']}")
    return [y, TensorType(DType.i64, y.shape)]


def _lowest(dtype: np.dtype) -> Any:
    # DType, not numpy's kind: ml_dtypes' bfloat16 has kind "V"
    return -np.inf if DType.from_np(dtype).is_float else np.iinfo(dtype).min


def _max_pool_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    n = x.ndim - 2
    kernel, w, out, pads = _geometry(ctx, x)
    half = x.dtype in (np.dtype(np.float16), DType.bf16.np)
    data = x.astype(np.float32) if half else x  # bf16/f16: exact in f32
    win = _flat(sliding_windows(data, kernel, w, out, pads, _lowest(data.dtype)), n)
    y = win.max(axis=-1)
    outs = [y.astype(ctx.out_dtype(0), copy=False)]
    if len(ctx.out_types) > 1:
        outs.append(_argmax_indices(ctx, x, win, y, kernel, w, out, pads))
    return outs


def _argmax_indices(
    ctx: RefCtx, x: np.ndarray, win: np.ndarray, y: np.ndarray, kernel: tuple[int, ...], w: WindowAttrs,
    out: list[int], pads: list[tuple[int, int]],
) -> np.ndarray:
    """Flat input index of each window's maximum (first one in window order), padding excluded."""
    n = x.ndim - 2
    # A window's valid taps: padded or overhanging positions never win, even against -inf data.
    valid = np.zeros((1, 1, *x.shape[2:]), dtype=bool)
    valid[...] = True
    vwin = _flat(sliding_windows(valid, kernel, w, out, pads, False), n)
    hit = (win == y[..., None]) & vwin
    tap = np.argmax(hit, axis=-1)  # [N, C, *out]
    taps = np.unravel_index(tap, kernel)
    spatial = x.shape[2:]
    coords = []
    for i in range(n):
        o = np.arange(out[i]).reshape((1, 1, *(out[j] if j == i else 1 for j in range(n))))
        coords.append(o * w.strides[i] - pads[i][0] + taps[i] * w.dilations[i])
    if int(ctx.attrs["storage_order"]) == 1:  # column major within each [D1, ..., Dn] plane
        flat_spatial = np.ravel_multi_index(tuple(coords), spatial, order="F")
    else:
        flat_spatial = np.ravel_multi_index(tuple(coords), spatial, order="C")
    plane = int(np.prod(spatial, dtype=np.int64))
    nc = np.arange(x.shape[0] * x.shape[1], dtype=np.int64).reshape(x.shape[0], x.shape[1], *([1] * n))
    return np.asarray(nc * plane + flat_spatial, dtype=np.int64)


register(
    OpDef(
        name="max_pool",
        inputs=("X",),
        outputs=("Y", "Indices?"),
        attrs={**_WINDOW_ATTRS, "storage_order": AttrSpec("int", 0)},
        infer=_max_pool_infer,
        reference=_max_pool_ref,
        doc="N-d max pooling (ONNX MaxPool); Indices are flat indices into X.",
    )
)


# average_pool -----------------------------------------------------------------------------------


def _average_pool_infer(ctx: InferCtx) -> list[TensorType]:
    return [_pool_infer(ctx, FLOATS)]


def _average_pool_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    n = x.ndim - 2
    kernel, w, out, pads = _geometry(ctx, x)
    acc = acc_dtype(x.dtype)
    total = _flat(sliding_windows(x.astype(acc, copy=False), kernel, w, out, pads, 0), n).sum(axis=-1)
    # The divisor counts the taps that land in the input, or with count_include_pad also those in
    # the explicit pads; taps in the ceil_mode overhang past the end pads never count.
    counted = np.ones((1, 1, *x.shape[2:]), dtype=acc)
    if int(ctx.attrs["count_include_pad"]):
        counted = np.pad(counted, [(0, 0), (0, 0), *pads], mode="constant", constant_values=1)
        inner = [(0, 0)] * n
    else:
        inner = pads
    count = _flat(sliding_windows(counted, kernel, w, out, inner, 0), n).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        y = total / count
    return [y.astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="average_pool",
        inputs=("X",),
        attrs={**_WINDOW_ATTRS, "count_include_pad": AttrSpec("int", 0)},
        infer=_average_pool_infer,
        reference=_average_pool_ref,
        tolerance=1e-4,
        doc="N-d average pooling (ONNX AveragePool).",
    )
)


# global pools -----------------------------------------------------------------------------------


def _global_infer(dtypes: frozenset[DType]) -> Any:
    def infer(ctx: InferCtx) -> list[TensorType]:
        ctx.require_dtype(0, dtypes)
        x = ctx.type(0)
        if x.rank < 3:
            raise ctx.fail(f"X must have rank >= 3 ([N, C, spatial...]), got {x}")
        return [TensorType(x.dtype, (*x.shape[:2], *([1] * (x.rank - 2))))]

    return infer


def _global_average_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axes = tuple(range(2, x.ndim))
    y = x.astype(acc_dtype(x.dtype), copy=False).mean(axis=axes, keepdims=True)
    return [y.astype(ctx.out_dtype(), copy=False)]


def _global_max_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    return [x.max(axis=tuple(range(2, x.ndim)), keepdims=True).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="global_average_pool",
        inputs=("X",),
        infer=_global_infer(FLOATS),
        reference=_global_average_ref,
        tolerance=1e-4,
        doc="Mean over all spatial dims, kept as size 1 (ONNX GlobalAveragePool).",
    )
)

register(
    OpDef(
        name="global_max_pool",
        inputs=("X",),
        infer=_global_infer(FLOATS),
        reference=_global_max_ref,
        doc="Max over all spatial dims, kept as size 1 (ONNX GlobalMaxPool).",
    )
)

"""Convolution ops (``conv``, ``conv_transpose``) and the sliding-window geometry they share with pooling.

Layout is ONNX's: ``X`` is ``[N, C, D1, ..., Dn]`` and the weight is ``[M, C / group, k1, ..., kn]``
(``[C, M / group, k1, ..., kn]`` for the transposed convolution), for any number ``n >= 1`` of
spatial dims.  Padding is resolved here once, both symbolically (shape inference) and concretely
(the reference), so that every stage agrees on where the windows lie.

The references are vectorised: a convolution is an im2col (a strided view of the padded input)
followed by one batched matmul over groups; a transposed convolution is one batched matmul
followed by a strided scatter-add per kernel offset (a loop over kernel taps, never over pixels).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.dtypes import FLOATS
from cuvil.ir.symbolic import UNKNOWN, Dim, ceildiv, floordiv
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


# Sliding-window geometry ----------------------------------------------------------------------


@dataclass(frozen=True)
class WindowAttrs:
    """The validated window attributes of a conv or pooling node (one entry per spatial dim)."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    auto_pad: str


def _ints_attr(ctx: InferCtx | RefCtx, name: str, n: int, default: int, minimum: int) -> tuple[int, ...]:
    value = ctx.attrs.get(name)
    if value is None:
        return (default,) * n
    vals = tuple(int(v) for v in value)
    if len(vals) != n:
        raise _fail(ctx, f"{name} has {len(vals)} values, expected {n} (one per spatial dim)")
    if any(v < minimum for v in vals):
        raise _fail(ctx, f"{name} must be >= {minimum}, got {list(vals)}")
    return vals


def _fail(ctx: InferCtx | RefCtx, message: str) -> Exception:
    if isinstance(ctx, InferCtx):
        return ctx.fail(message)
    return ValueError(f"{ctx.op}: {message}")


def window_attrs(ctx: InferCtx | RefCtx, n: int) -> WindowAttrs:
    """Read and check ``strides``, ``dilations``, ``pads`` and ``auto_pad`` for ``n`` spatial dims."""
    auto_pad = str(ctx.attrs.get("auto_pad", "NOTSET"))
    if auto_pad not in AUTO_PADS:
        raise _fail(ctx, f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PADS)}")
    strides = _ints_attr(ctx, "strides", n, 1, 1)
    dilations = _ints_attr(ctx, "dilations", n, 1, 1)
    pads = ctx.attrs.get("pads")
    if pads is None:
        pads_list = [0] * (2 * n)
    else:
        pads_list = [int(p) for p in pads]
        if len(pads_list) != 2 * n:
            raise _fail(ctx, f"pads has {len(pads_list)} values, expected {2 * n} (begin and end per spatial dim)")
        if any(p < 0 for p in pads_list):
            raise _fail(ctx, f"pads must be non-negative, got {pads_list}")
    if auto_pad != "NOTSET":
        pads_list = [0] * (2 * n)  # explicit pads are ignored (and usually absent) under auto_pad
    return WindowAttrs(strides, dilations, tuple(pads_list[:n]), tuple(pads_list[n:]), auto_pad)


def kernel_extent(k: Dim, d: int) -> Dim:
    """The span of a dilated kernel: ``(k - 1) * d + 1``."""
    return (k - 1) * d + 1


def window_out_dim(size: Dim, k: Dim, i: int, w: WindowAttrs, ceil_mode: bool = False) -> Dim:
    """Number of window positions along spatial dim ``i`` (symbolic when ``size`` is)."""
    s, dk = w.strides[i], kernel_extent(k, w.dilations[i])
    if w.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        return ceildiv(size, s)
    if w.auto_pad == "VALID":
        return floordiv(size - dk, s) + 1
    pb, pe = w.pads_begin[i], w.pads_end[i]
    span = size + pb + pe - dk
    if not ceil_mode:
        return floordiv(span, s) + 1
    out = ceildiv(span, s) + 1
    # The last window must start inside the input or the left padding; otherwise drop it.
    if isinstance(out, int) and isinstance(size, int):
        return out - 1 if (out - 1) * s >= size + pb else out
    if isinstance(dk, int) and s <= dk - pe:
        return out  # ceil(span / s) * s < size + pb always holds, so the rule never fires
    return UNKNOWN


def concrete(d: Dim) -> int:
    """A dim the reference needs as a number (its inputs are arrays, so every dim is known)."""
    if not isinstance(d, int):
        raise ValueError(f"dim {d} is not known when running")
    return d


def resolve_pads(size: int, k: int, i: int, w: WindowAttrs, out: int) -> tuple[int, int]:
    """Concrete (begin, end) padding of spatial dim ``i`` for an input of ``size`` and ``out`` windows."""
    if w.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = max((out - 1) * w.strides[i] + (k - 1) * w.dilations[i] + 1 - size, 0)
        small, large = total // 2, total - total // 2
        return (small, large) if w.auto_pad == "SAME_UPPER" else (large, small)
    return w.pads_begin[i], w.pads_end[i]


def sliding_windows(
    x: np.ndarray, kernel: Sequence[int], w: WindowAttrs, out: Sequence[int], pads: Sequence[tuple[int, int]],
    fill: Any, *, channels_last: bool = False,
) -> np.ndarray:
    """A view ``[N, C, *out, *kernel]`` of the windows of ``x`` padded with ``fill``.

    The end padding is extended when ``ceil_mode`` makes the last window overhang it; the
    overhang is filled with ``fill`` too (callers mask it out where it matters).
    ``channels_last``: the view is ``[N, *out, C, *kernel]``, over a padded copy of ``x`` whose
    channels are innermost, so that copying it in that order (im2col) reads memory in runs."""
    n = len(kernel)
    widths = [(0, 0), (0, 0)]
    extents = tuple((kernel[i] - 1) * w.dilations[i] + 1 for i in range(n))
    for i in range(n):
        dk = extents[i]
        pb, pe = pads[i]
        need = (out[i] - 1) * w.strides[i] + dk - x.shape[2 + i] - pb
        widths.append((pb, max(pe, need, 0)))
    spatial = tuple(slice(0, (out[i] - 1) * w.strides[i] + 1, w.strides[i]) for i in range(n))
    taps = tuple(slice(None, None, w.dilations[i]) for i in range(n))
    if channels_last:
        xc = np.moveaxis(x, 1, -1)
        widths = [widths[0], *widths[2:], widths[1]]
        xp = (np.pad(xc, widths, mode="constant", constant_values=fill) if any(a or b for a, b in widths)
              else np.ascontiguousarray(xc))
        view = np.lib.stride_tricks.sliding_window_view(xp, extents, axis=tuple(range(1, 1 + n)))
        return view[(slice(None), *spatial, slice(None), *taps)]
    xp = np.pad(x, widths, mode="constant", constant_values=fill) if any(a or b for a, b in widths) else x
    view = np.lib.stride_tricks.sliding_window_view(xp, extents, axis=tuple(range(2, 2 + n)))
    return view[(slice(None), slice(None), *spatial, *taps)]


def acc_dtype(dtype: np.dtype) -> type[np.floating[Any]]:
    """The dtype a float reference accumulates in: float64 for float64, else float32."""
    return np.float64 if dtype == np.float64 else np.float32


# conv ------------------------------------------------------------------------------------------

CONV_ATTRS = {  # also the integer convolutions' (ops/qlinear.py)
    "auto_pad": AttrSpec("str", "NOTSET"),
    "dilations": AttrSpec("ints", None),
    "group": AttrSpec("int", 1),
    "kernel_shape": AttrSpec("ints", None),
    "pads": AttrSpec("ints", None),
    "strides": AttrSpec("ints", None),
}


def _check_conv_operands(ctx: InferCtx, transposed: bool) -> tuple[TensorType, TensorType, int, list[Dim]]:
    """Common checks of conv/conv_transpose; returns X, W types, group and the kernel dims."""
    dt = ctx.require_dtype(0, FLOATS)
    if ctx.type(1).dtype != dt or (ctx.has(2) and ctx.type(2).dtype != dt):
        raise ctx.fail("X, W and B must share one element type")
    x, wt = ctx.type(0), ctx.type(1)
    if x.rank < 3:
        raise ctx.fail(f"X must have rank >= 3 ([N, C, spatial...]), got {x}")
    if wt.rank != x.rank:
        raise ctx.fail(f"W must have the rank of X ({x.rank}), got {wt}")
    group = int(ctx.attrs["group"])
    if group < 1:
        raise ctx.fail(f"group must be >= 1, got {group}")
    n = x.rank - 2
    kernel: list[Dim] = list(wt.shape[2:])
    ks = ctx.attrs["kernel_shape"]
    if ks is not None:
        ks = [int(k) for k in ks]
        if len(ks) != n or any(k < 1 for k in ks):
            raise ctx.fail(f"kernel_shape {ks} must hold {n} positive values")
        for i, (a, b) in enumerate(zip(ks, kernel)):
            if isinstance(b, int) and a != b:
                raise ctx.fail(f"kernel_shape {ks} does not match the weight's spatial dims {list(wt.shape[2:])}")
            ctx.assume_equal(b, a, f"weight spatial dim {i} and kernel_shape")
        kernel = list(ks)
    c_in, w0, w1 = x.shape[1], wt.shape[0], wt.shape[1]
    if transposed:
        if isinstance(c_in, int) and isinstance(w0, int) and c_in != w0:
            raise ctx.fail(f"X has {c_in} channels but W expects {w0} (W is [C, M/group, k...])")
        ctx.assume_equal(c_in, w0, "input channels and weight dim 0")
        if isinstance(w0, int) and w0 % group:
            raise ctx.fail(f"input channels {w0} are not divisible by group {group}")
    else:
        if isinstance(c_in, int) and isinstance(w1, int) and c_in != w1 * group:
            raise ctx.fail(f"X has {c_in} channels but W expects {w1} x group {group}")
        ctx.assume_equal(c_in, w1 * group, "input channels and weight channels x group")
        if isinstance(w0, int) and w0 % group:
            raise ctx.fail(f"output channels {w0} are not divisible by group {group}")
    if ctx.has(2):
        bt = ctx.type(2)
        m = w1 * group if transposed else w0
        if bt.rank != 1 or (isinstance(bt.shape[0], int) and isinstance(m, int) and bt.shape[0] != m):
            raise ctx.fail(f"B must be 1-D with {m} elements, got {bt}")
        ctx.assume_equal(bt.shape[0], m, "bias length and output channels")
    return x, wt, group, kernel


def _conv_infer(ctx: InferCtx) -> list[TensorType]:
    x, wt, _, kernel = _check_conv_operands(ctx, transposed=False)
    w = window_attrs(ctx, x.rank - 2)
    spatial = [window_out_dim(size, k, i, w) for i, (size, k) in enumerate(zip(x.shape[2:], kernel))]
    return [TensorType(x.dtype, (x.shape[0], wt.shape[0], *spatial))]


def _conv_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, wgt = ctx.input(0), ctx.input(1)
    acc = acc_dtype(x.dtype)
    n = x.ndim - 2
    group = int(ctx.attrs["group"])
    kernel = wgt.shape[2:]
    w = window_attrs(ctx, n)
    out = [concrete(window_out_dim(x.shape[2 + i], kernel[i], i, w)) for i in range(n)]
    pads = [resolve_pads(x.shape[2 + i], kernel[i], i, w, out[i]) for i in range(n)]
    # [N, *out, C, *kernel], over a channels-innermost copy: the im2col copy below reads it in runs
    cols = sliding_windows(x.astype(acc, copy=False), kernel, w, out, pads, 0, channels_last=True)
    batch, chans = x.shape[0], x.shape[1]
    m = wgt.shape[0]
    cg, mg = chans // group, m // group
    npix, nk = int(np.prod(out, dtype=np.int64)), int(np.prod(kernel, dtype=np.int64))
    # im2col: [G, N * pixels, Cg * taps] @ [G, Cg * taps, Mg] -> [G, N * pixels, Mg]
    cols = cols.reshape(batch, *out, group, cg, *kernel)
    perm = (n + 1, 0, *range(1, 1 + n), n + 2, *range(n + 3, 2 * n + 3))
    a = np.ascontiguousarray(cols.transpose(perm)).reshape(group, batch * npix, cg * nk)
    b = wgt.astype(acc, copy=False).reshape(group, mg, cg * nk).transpose(0, 2, 1)
    y = np.matmul(a, b).reshape(group, batch, *out, mg)
    y = np.moveaxis(y, -1, 1).reshape(group * mg, batch, *out)  # [M, N, *out]
    y = np.moveaxis(y, 0, 1)
    if ctx.has(2):
        y = y + ctx.input(2).astype(acc).reshape((m,) + (1,) * n)
    return [np.ascontiguousarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="conv",
        inputs=("X", "W", "B?"),
        attrs=CONV_ATTRS,
        infer=_conv_infer,
        reference=_conv_ref,
        tolerance=1e-4,
        doc="N-d grouped, dilated, strided convolution (ONNX Conv).",
    )
)


# conv_transpose --------------------------------------------------------------------------------


def _output_shape_attr(ctx: InferCtx | RefCtx, n: int) -> list[int] | None:
    shape = ctx.attrs.get("output_shape")
    if shape is None:
        return None
    vals = [int(v) for v in shape]
    if len(vals) == n + 2:  # some exporters give the full [N, M, spatial...] shape
        vals = vals[2:]
    if len(vals) != n or any(v < 0 for v in vals):
        raise _fail(ctx, f"output_shape {list(shape)} must hold {n} non-negative spatial sizes")
    return vals


def _transpose_geometry(
    ctx: InferCtx | RefCtx, sizes: Sequence[Dim], kernel: Sequence[Dim]
) -> tuple[list[Dim], list[tuple[Dim, Dim]]]:
    """Output spatial sizes and (begin, end) pads of a transposed convolution."""
    n = len(sizes)
    w = window_attrs(ctx, n)
    out_pad = _ints_attr(ctx, "output_padding", n, 0, 0)
    for i in range(n):
        if out_pad[i] >= max(w.strides[i], w.dilations[i]):
            raise _fail(ctx, f"output_padding {list(out_pad)} must be smaller than the stride or the dilation")
    explicit = _output_shape_attr(ctx, n)
    outs: list[Dim] = []
    pads: list[tuple[Dim, Dim]] = []
    for i in range(n):
        full = w.strides[i] * (sizes[i] - 1) + out_pad[i] + kernel_extent(kernel[i], w.dilations[i])
        if explicit is not None or w.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out: Dim = explicit[i] if explicit is not None else sizes[i] * w.strides[i]
            total = full - out
            half = floordiv(total, 2)
            # SAME_UPPER puts the extra pixel of padding at the end; otherwise at the beginning.
            pads.append((half, total - half) if w.auto_pad == "SAME_UPPER" else (total - half, half))
            outs.append(out)
        else:
            pb, pe = w.pads_begin[i], w.pads_end[i]
            pads.append((pb, pe))
            outs.append(full - pb - pe)
    return outs, pads


def _conv_transpose_infer(ctx: InferCtx) -> list[TensorType]:
    x, wt, group, kernel = _check_conv_operands(ctx, transposed=True)
    outs, _ = _transpose_geometry(ctx, x.shape[2:], kernel)
    for d in outs:
        if isinstance(d, int) and d < 0:
            raise ctx.fail(f"the output spatial size {outs} is negative (pads too large)")
    return [TensorType(x.dtype, (x.shape[0], wt.shape[1] * group, *outs))]


def _conv_transpose_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, wgt = ctx.input(0), ctx.input(1)
    acc = acc_dtype(x.dtype)
    n = x.ndim - 2
    group = int(ctx.attrs["group"])
    sizes, kernel = x.shape[2:], wgt.shape[2:]
    w = window_attrs(ctx, n)
    outs_d, pads_d = _transpose_geometry(ctx, sizes, kernel)
    outs = [concrete(d) for d in outs_d]
    pads = [(concrete(a), concrete(b)) for a, b in pads_d]
    batch, chans = x.shape[0], x.shape[1]
    cg, mg = chans // group, wgt.shape[1]
    npix, nk = int(np.prod(sizes, dtype=np.int64)), int(np.prod(kernel, dtype=np.int64))
    # Every input pixel times every kernel tap: [G, N * pixels, Cg] @ [G, Cg, Mg * taps].
    a = x.astype(acc, copy=False).reshape(batch, group, cg, npix).transpose(1, 0, 3, 2).reshape(group, batch * npix, cg)
    b = wgt.astype(acc, copy=False).reshape(group, cg, mg * nk)
    contrib = np.matmul(a, b).reshape(group, batch, *sizes, mg, *kernel)
    perm = (1, 0, 2 + n, *range(3 + n, 3 + 2 * n), *range(2, 2 + n))
    contrib = contrib.transpose(perm).reshape(batch, group * mg, *kernel, *sizes)
    # Scatter-add each tap at positions i * stride + k * dilation of the unpadded ("full") output.
    full = [(sizes[i] - 1) * w.strides[i] + (kernel[i] - 1) * w.dilations[i] + 1 for i in range(n)]
    buf = np.zeros((batch, group * mg, *full), dtype=acc)
    for taps in itertools.product(*(range(k) for k in kernel)):
        dst = tuple(
            slice(t * w.dilations[i], t * w.dilations[i] + (sizes[i] - 1) * w.strides[i] + 1, w.strides[i])
            for i, t in enumerate(taps)
        )
        buf[(slice(None), slice(None), *dst)] += contrib[(slice(None), slice(None), *taps)]
    # Crop the begin pads; positions past the full output (output_padding, negative pads) stay zero.
    y = np.zeros((batch, group * mg, *outs), dtype=acc)
    src_idx, dst_idx = [slice(None)] * 2, [slice(None)] * 2
    for i in range(n):
        pb = pads[i][0]
        s0, d0 = max(pb, 0), max(-pb, 0)
        length = max(min(full[i] - s0, outs[i] - d0), 0)
        src_idx.append(slice(s0, s0 + length))
        dst_idx.append(slice(d0, d0 + length))
    y[tuple(dst_idx)] = buf[tuple(src_idx)]
    if ctx.has(2):
        y += ctx.input(2).astype(acc).reshape((group * mg,) + (1,) * n)
    return [y.astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="conv_transpose",
        inputs=("X", "W", "B?"),
        attrs={
            **CONV_ATTRS,
            "output_padding": AttrSpec("ints", None),
            "output_shape": AttrSpec("ints", None),
        },
        infer=_conv_transpose_infer,
        reference=_conv_transpose_ref,
        tolerance=1e-4,
        doc="N-d grouped, dilated, strided transposed convolution (ONNX ConvTranspose).",
    )
)

"""Linear quantization ops: ``quantize_linear``, ``dequantize_linear`` and ``dynamic_quantize_linear``.

The semantics are ONNX's newest (opset 25), for the quantized types int8, uint8,
int16, uint16 and the low-bit storage types int4, uint4, int2, uint2, the float8
types and float4 (``cuvil/ops/lowbit.py``):

1. ``quantize_linear(X, scale, zero_point?)``: ``y = saturate(rint(X / scale) + zero_point)``.
   The division is done in the element type named by ``precision`` (default:
   the scale's), with ``X`` first converted to it; ``rint`` rounds half to even;
   saturation clamps to the output type's range.  The output type is the zero
   point's, else ``output_dtype``, else uint8.  ``X`` may be NaN: it gives the
   zero point (ONNX leaves it undefined; Cuvil defines it, the same on every target).
   For a float8 or float4 output, ``y`` is ``X / scale`` converted as ``cast`` converts
   (round to nearest even; ``saturate``, default 1, clamps float8 results to the largest
   finite value, else they overflow to infinity or NaN; float4 always saturates), and
   the zero point must be zero (checked at compile time when it is a constant, else
   when the node runs).  ``saturate`` changes nothing for integer outputs.
2. ``dequantize_linear(X, scale, zero_point?)``: ``y = (X - zero_point) * scale``,
   computed in float32 (float64 when the scale or output is float64) and rounded
   once to the output type (``output_dtype``, default the scale's).  A float8 or float4
   ``X`` has a zero point of zero (checked as in 1) and is not shifted.
3. Granularity is read from the scale's shape (the zero point has the same, or both
   hold one element, whatever their ranks): one element is per-tensor; with ``block_size == 0`` a 1-D scale is per-axis
   (its length is ``X``'s dim ``axis``); with ``block_size = B > 0`` the scale
   has ``X``'s rank, ``ceil(D / B)`` at ``axis`` and ``X``'s dims elsewhere: element
   ``i`` along ``axis`` uses scale ``i // B`` (blocked quantization).
4. ``dynamic_quantize_linear(X)`` (float32 to uint8): the range ``[min(0, min X), max(0, max X)]``
   gives ``scale = (max - min) / 255`` (1/255 when the range is empty) and
   ``zero_point = rint(clamp(-min / scale, 0, 255))``, all in float32; ``Y`` is ``X``
   quantized with them.  NaN elements are left out of the range.

:func:`granularity` / :func:`ref_granularity` and :func:`quantize_values` are the one NumPy
definition of the granularity and the quantization step; the integer-product ops
(``cuvil/ops/qlinear.py``) requantize with them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil.ir.dtypes import FLOATS, LOWBIT_FLOATS, DType
from cuvil.ir.symbolic import ceildiv
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axis
from cuvil.ops.lowbit import LOWBIT_INT_RANGES, check_zero_point, to_lowbit_float
from cuvil.ops.registry import KEEP_OPERANDS, STORAGE_TYPES, AttrSpec, InferCtx, OpDef, RefCtx, register

# The integer element types a tensor can be quantized to, and their ranges.
QUANT_RANGES: dict[DType, tuple[int, int]] = {
    DType.i8: (-128, 127),
    DType.u8: (0, 255),
    DType.i16: (-32768, 32767),
    DType.u16: (0, 65535),
}
QUANT_DTYPES = frozenset(QUANT_RANGES)
# quantize_linear / dequantize_linear also take the low-bit types (the integer-product ops do not)
LINEAR_INT_RANGES: dict[DType, tuple[int, int]] = {**QUANT_RANGES, **LOWBIT_INT_RANGES}
LINEAR_DTYPES = frozenset(LINEAR_INT_RANGES) | LOWBIT_FLOATS
_QUANTIZE_INPUTS = FLOATS | {DType.i32}
_DEQUANTIZE_INPUTS = LINEAR_DTYPES | {DType.i32}


@dataclass(frozen=True)
class Granularity:
    """How a scale (and zero point) maps onto the quantized tensor.

    ``kind`` is ``"tensor"``, ``"axis"`` or ``"block"``; ``axis`` is non-negative
    (0 for per-tensor); ``block`` is the block size (0 unless blocked)."""

    kind: str
    axis: int = 0
    block: int = 0


def granularity(ctx: InferCtx, x_index: int, scale_index: int, zp_index: int | None) -> Granularity:
    """The granularity of a quantize/dequantize node, its shapes checked (rule 3)."""
    x, s = ctx.type(x_index), ctx.type(scale_index)
    block = int(ctx.attrs.get("block_size") or 0)
    axis = int(ctx.attrs.get("axis", 1))
    if block < 0:
        raise ctx.fail(f"block_size must be >= 0, got {block}")
    if zp_index is not None and ctx.has(zp_index) and not all(d == 1 for d in (*s.shape, *ctx.type(zp_index).shape)):
        z = ctx.type(zp_index)
        if z.rank != s.rank:
            raise ctx.fail(f"the zero point {z} must have the scale's shape {s}")
        for i, (a, b) in enumerate(zip(z.shape, s.shape)):
            if isinstance(a, int) and isinstance(b, int) and a != b:
                raise ctx.fail(f"the zero point {z} must have the scale's shape {s}")
            ctx.assume_equal(a, b, f"zero point and scale dims at axis {i}")
    if all(d == 1 for d in s.shape):
        return Granularity("tensor")
    if block == 0:
        if s.rank != 1:
            raise ctx.fail(f"the scale must be a scalar or 1-D (per-axis) unless block_size is set, got {s}")
        ax = _axis(ctx, axis, x.rank)
        d = x.shape[ax]
        if isinstance(d, int) and isinstance(s.shape[0], int) and d != s.shape[0]:
            raise ctx.fail(f"per-axis scale has {s.shape[0]} elements, but axis {ax} of {x} has {d}")
        ctx.assume_equal(s.shape[0], d, "per-axis scale length and the quantized axis")
        return Granularity("axis", ax)
    if s.rank != x.rank:
        raise ctx.fail(f"a blocked scale must have the rank of X ({x.rank}), got {s}")
    ax = _axis(ctx, axis, x.rank)
    for i, (sd, xd) in enumerate(zip(s.shape, x.shape)):
        want = ceildiv(xd, block) if i == ax else xd
        if isinstance(sd, int) and isinstance(want, int) and sd != want:
            raise ctx.fail(f"blocked scale {s} does not fit X {x} with block_size {block} on axis {ax}")
        ctx.assume_equal(sd, want, f"blocked scale dim {i} and X's dim {i}" + (" in blocks" if i == ax else ""))
    return Granularity("block", ax, block)


def _axis(ctx: InferCtx, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} is out of range for rank {rank}")
    return normalize_axis(ctx.op, axis, rank)


def ref_granularity(x: np.ndarray, p: np.ndarray, axis: int, block: int) -> Granularity:
    """Rule 3 on concrete arrays (shapes already checked by inference)."""
    if p.size == 1:
        return Granularity("tensor")
    ax = axis % x.ndim
    return Granularity("axis", ax) if block == 0 else Granularity("block", ax, block)


def expand_param(p: np.ndarray, x_shape: tuple[int, ...], g: Granularity) -> np.ndarray:
    """A scale or zero point broadcastable against ``x_shape`` under granularity ``g``."""
    if g.kind == "tensor":
        return p.reshape(())
    if g.kind == "axis":
        dims = [1] * len(x_shape)
        dims[g.axis] = p.size
        return p.reshape(dims)
    rep = np.repeat(p, g.block, axis=g.axis)
    return rep.take(np.arange(x_shape[g.axis]), axis=g.axis)


def quantize_values(q: np.ndarray, zero_point: np.ndarray | int, out: DType) -> np.ndarray:
    """``saturate(rint(q) + zero_point)`` as ``out``: half to even, NaN gives the zero point.

    ``q`` is the already-scaled value (any float type); the clamp happens before the
    zero point is added, in the float domain, so no intermediate overflows."""
    lo, hi = LINEAR_INT_RANGES[out]
    zp = np.asarray(zero_point).astype(np.int64)
    r = np.rint(np.asarray(q, dtype=np.float64))
    r = np.where(np.isnan(r), 0.0, r)
    r = np.clip(r, lo - zp, hi - zp)
    return np.asarray(r.astype(np.int64) + zp).astype(out.np)


# quantize_linear --------------------------------------------------------------------------------


def quantize_out_dtype(ctx: InferCtx) -> DType:
    """The output type of ``quantize_linear``: the zero point's, else ``output_dtype``, else uint8."""
    out = ctx.attrs.get("output_dtype")
    if out is not None and not isinstance(out, DType):
        raise ctx.fail(f"output_dtype must be an element type, got {out!r}")
    if ctx.has(2):
        zdt = ctx.type(2).dtype
        if out is not None and out is not zdt:
            raise ctx.fail(f"output_dtype {out} differs from the zero point's element type {zdt}")
        out = zdt
    out = out or DType.u8
    if out not in LINEAR_DTYPES:
        names = ", ".join(str(d) for d in DType if d in LINEAR_DTYPES)
        raise ctx.fail(f"cannot quantize to {out}: the quantized type must be one of {names}")
    return out


def check_float_zero_point(ctx: InferCtx, quantized: DType) -> None:
    """A float8 / float4 quantization's zero point must be zero: checked here when it is a constant."""
    if quantized in LOWBIT_FLOATS and ctx.has(2) and (zp := ctx.const(2)) is not None:
        why = check_zero_point(zp, quantized)
        if why is not None:
            raise ctx.fail(why)


def ref_zero_point(ctx: RefCtx, quantized: DType) -> None:
    """The same check on the value a run gives (a zero point that is not a constant)."""
    if quantized in LOWBIT_FLOATS and ctx.has(2):
        why = check_zero_point(ctx.input(2), quantized)
        if why is not None:
            raise ValueError(why)


def precision_of(ctx: InferCtx | RefCtx, scale: DType) -> DType:
    """The element type the division ``X / scale`` is done in."""
    p = ctx.attrs.get("precision")
    return p if isinstance(p, DType) else scale


def _quantize_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    ctx.require_dtype(0, _QUANTIZE_INPUTS)
    sdt = ctx.require_dtype(1, FLOATS)
    out = quantize_out_dtype(ctx)
    prec = ctx.attrs.get("precision")
    if prec is not None and (not isinstance(prec, DType) or prec not in FLOATS):
        raise ctx.fail(f"precision must be a float element type, got {prec}")
    if x.dtype is DType.i32 and precision_of(ctx, sdt) in (DType.f16, DType.bf16):
        raise ctx.fail(f"quantizing i32 with the division in {precision_of(ctx, sdt)} is not supported")
    if ctx.attrs["saturate"] not in (0, 1):
        raise ctx.fail(f"saturate must be 0 or 1, got {ctx.attrs['saturate']!r}")
    check_float_zero_point(ctx, out)
    granularity(ctx, 0, 1, 2)
    return [TensorType(out, x.shape)]


def _quantize_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, s = ctx.input(0), ctx.input(1)
    g = ref_granularity(x, s, int(ctx.attrs["axis"]), int(ctx.attrs["block_size"]))
    prec = precision_of(ctx, DType.from_np(s.dtype)).np
    with np.errstate(all="ignore"):
        q = x.astype(prec) / expand_param(s, x.shape, g).astype(prec)
    out = ctx.out_types[0].dtype
    if out in LOWBIT_FLOATS:
        ref_zero_point(ctx, out)
        return [to_lowbit_float(q, out, bool(ctx.attrs["saturate"]))]
    zp = expand_param(ctx.input(2), x.shape, g) if ctx.has(2) else 0
    return [quantize_values(q, zp, out)]


register(
    OpDef(
        name="quantize_linear",
        inputs=("X", "scale", "zero_point?"),
        attrs={
            "axis": AttrSpec("int", 1),
            "block_size": AttrSpec("int", 0),
            "output_dtype": AttrSpec("dtype", None),
            "precision": AttrSpec("dtype", None),
            "saturate": AttrSpec("int", 1),
        },
        infer=_quantize_infer,
        reference=_quantize_ref,
        tolerance=0.0,
        traits=frozenset({STORAGE_TYPES}),
        doc="saturate(rint(X / scale) + zero_point): per-tensor, per-axis or blocked (ONNX QuantizeLinear).",
    )
)


# dequantize_linear ------------------------------------------------------------------------------


def _dequantize_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    xdt = ctx.require_dtype(0, _DEQUANTIZE_INPUTS)
    sdt = ctx.require_dtype(1, FLOATS)
    if ctx.has(2) and ctx.type(2).dtype is not xdt:
        raise ctx.fail(f"the zero point's element type {ctx.type(2).dtype} differs from X's {xdt}")
    out = ctx.attrs.get("output_dtype") or sdt
    if not isinstance(out, DType) or out not in FLOATS:
        raise ctx.fail(f"output_dtype must be a float element type, got {out}")
    check_float_zero_point(ctx, xdt)
    granularity(ctx, 0, 1, 2)
    return [TensorType(out, x.shape)]


def dequantize_compute(scale: DType, out: DType) -> np.dtype:
    """The float type ``(X - zero_point) * scale`` is computed in (rule 2)."""
    return np.dtype(np.float64) if DType.f64 in (scale, out) else np.dtype(np.float32)


def _dequantize_ref(ctx: RefCtx) -> list[np.ndarray]:
    x, s = ctx.input(0), ctx.input(1)
    out = ctx.out_types[0].dtype
    g = ref_granularity(x, s, int(ctx.attrs["axis"]), int(ctx.attrs["block_size"]))
    cd = dequantize_compute(DType.from_np(s.dtype), out)
    dx = x.astype(cd)
    xdt = DType.from_np(x.dtype)
    ref_zero_point(ctx, xdt)
    if ctx.has(2) and xdt not in LOWBIT_FLOATS:
        dx = dx - expand_param(ctx.input(2), x.shape, g).astype(cd)
    y = dx * expand_param(s, x.shape, g).astype(cd)
    return [np.asarray(y).astype(out.np)]


register(
    OpDef(
        name="dequantize_linear",
        inputs=("X", "scale", "zero_point?"),
        attrs={
            "axis": AttrSpec("int", 1),
            "block_size": AttrSpec("int", 0),
            "output_dtype": AttrSpec("dtype", None),
        },
        infer=_dequantize_infer,
        reference=_dequantize_ref,
        tolerance=0.0,
        traits=frozenset({STORAGE_TYPES, KEEP_OPERANDS}),  # quantized weights stay quantized for fold-qdq
        doc="(X - zero_point) * scale: per-tensor, per-axis or blocked (ONNX DequantizeLinear).",
    )
)


# dynamic_quantize_linear ------------------------------------------------------------------------


def _dynamic_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    if x.dtype is not DType.f32:
        raise ctx.fail(f"X must be f32, got {x.dtype}")
    return [TensorType(DType.u8, x.shape), TensorType(DType.f32, ()), TensorType(DType.u8, ())]


def dynamic_params(x: np.ndarray) -> tuple[np.float32, np.uint8]:
    """Rule 4's scale and zero point of ``x`` (float32 arithmetic throughout)."""
    f = np.float32
    ok = ~np.isnan(x)
    hi = f(np.max(x, initial=0.0, where=ok))
    lo = f(np.min(x, initial=0.0, where=ok))
    scale = f(f(1.0) if hi == lo else f(hi - lo)) / f(255)
    zp = np.clip(f(0) - lo / scale, f(0), f(255))
    return f(scale), np.uint8(np.rint(zp))


def _dynamic_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    scale, zp = dynamic_params(x)
    with np.errstate(all="ignore"):
        q = x / scale
    return [quantize_values(q, int(zp), DType.u8), np.array(scale, np.float32), np.array(zp, np.uint8)]


register(
    OpDef(
        name="dynamic_quantize_linear",
        inputs=("X",),
        outputs=("Y", "Y_scale", "Y_zero_point"),
        infer=_dynamic_infer,
        reference=_dynamic_ref,
        tolerance=0.0,
        doc="X quantized to uint8 with a scale and zero point computed from its range (ONNX DynamicQuantizeLinear).",
    )
)

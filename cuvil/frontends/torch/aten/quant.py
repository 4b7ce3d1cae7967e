"""Quantization ops of exported PyTorch models: PT2E's ``quantized_decomposed`` ops and fake-quantize.

``convert_pt2e`` (PyTorch's PT2E flow, QAT or PTQ) leaves ``quantized_decomposed.quantize_per_tensor``
/ ``dequantize_per_tensor`` / ``quantize_per_channel`` / ``dequantize_per_channel`` in the graph;
a QAT model exported before conversion holds ``aten.fake_quantize_per_{tensor,channel}_affine``
(decomposed into their ``_cachemask`` forms).  They map onto ``quantize_linear`` /
``dequantize_linear`` (a fake-quantize onto the pair), so that ``fold-qdq`` sees the same pattern
as in an ONNX QDQ model.  What is kept and what differs:

1. Scales are kept exactly: a Python-float scale (per-tensor) becomes a float32 constant, which
   is the value PyTorch computes with (a float scalar against a float32 tensor is applied in
   float32); a scale tensor keeps its element type (a float64 one makes ``quantize_linear``
   divide in float64, as PyTorch multiplies in float64).  Zero points keep their values, cast to
   the quantized type, as ONNX wants them.
2. PyTorch quantizes as ``round(x * (1 / scale))``, ONNX (and Cuvil) as ``rint(x / scale)``: the
   two agree except where ``x / scale`` lies within a rounding error of a tie (``k + 0.5``), where
   they can differ by one step.
3. ``quant_min``/``quant_max`` narrower than the quantized type's range (``[-127, 127]`` weights,
   7-bit ``reduce_range`` activations) become a ``clip`` of the quantized integers, which is
   exactly PyTorch's clamp.  A fake-quantize's type is the smallest of uint8, int8, uint16 and
   int16 that holds ``[quant_min, quant_max]``.
4. The ``mask`` result of a ``_cachemask`` fake-quantize is for training; a graph that reads it
   is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.frontends.torch.aten.common import cast, mapping, used_results
from cuvil.frontends.torch.converter import TorchCtx, torch_dtype
from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.graph import Value
from cuvil.ops.quant import QUANT_RANGES

_FAKE_TYPES = (DType.u8, DType.i8, DType.u16, DType.i16)


def _qtype(ctx: TorchCtx, dtype: Any, qmin: int, qmax: int) -> DType:
    dt = torch_dtype(dtype)
    if dt not in QUANT_RANGES:
        raise ctx.unsupported(f"quantization to {dt}: Cuvil quantizes to {', '.join(map(str, QUANT_RANGES))}")
    _check_bounds(ctx, dt, qmin, qmax)
    return dt


def _check_bounds(ctx: TorchCtx, dt: DType, qmin: int, qmax: int) -> None:
    lo, hi = QUANT_RANGES[dt]
    if not (isinstance(qmin, int) and isinstance(qmax, int) and lo <= qmin <= qmax <= hi):
        raise ctx.fail(f"quant_min={qmin!r}, quant_max={qmax!r} are not a range within {dt}'s {lo}..{hi}")


def _fake_type(ctx: TorchCtx, qmin: Any, qmax: Any) -> DType:
    if not (isinstance(qmin, int) and isinstance(qmax, int) and qmin <= qmax):
        raise ctx.fail(f"quant_min={qmin!r}, quant_max={qmax!r} must be static ints, quant_min <= quant_max")
    for dt in _FAKE_TYPES:
        lo, hi = QUANT_RANGES[dt]
        if lo <= qmin and qmax <= hi:
            return dt
    raise ctx.unsupported(f"fake-quantize to [{qmin}, {qmax}]: wider than the 16-bit types Cuvil quantizes to")


def _scale(ctx: TorchCtx, arg: Any) -> Value:
    """A scale argument: a Python float as a float32 constant (rule 1), a tensor as it is."""
    if isinstance(arg, float | int) and not isinstance(arg, bool):
        return ctx.constant(np.array(arg, np.float32))
    v = ctx.value(arg)
    if v.type.dtype not in FLOATS:
        raise ctx.fail(f"the scale must be a float tensor, got {v.type}")
    return v


def _zero_point(ctx: TorchCtx, arg: Any, dt: DType, scale: Value) -> Value:
    """A zero point (Python int or integer tensor) as ``dt``, shaped like the scale."""
    if arg is None:
        if not scale.type.is_static:
            raise ctx.fail(f"a missing zero point needs a scale of static shape, got {scale.type}")
        return ctx.constant(np.zeros([d for d in scale.type.shape if isinstance(d, int)], dt.np))
    if isinstance(arg, int) and not isinstance(arg, bool):
        lo, hi = QUANT_RANGES[dt]
        if not lo <= arg <= hi:
            raise ctx.fail(f"zero point {arg} is outside {dt}'s range {lo}..{hi}")
        return ctx.constant(np.array(arg, dt.np))
    v = ctx.value(arg)
    if v.type.dtype.is_float:
        v = ctx.emit1("round", [v])  # PyTorch rounds a float zero point (fake-quantize accepts one)
    return cast(ctx, v, dt)


def _scalar_shape(ctx: TorchCtx, v: Value) -> Value:
    """A one-element per-tensor parameter as a 0-d tensor."""
    if v.type.rank == 0:
        return v
    return ctx.emit1("reshape", [v, ctx.constant(np.zeros(0, np.int64))])


def _quantize(ctx: TorchCtx, x: Value, scale: Value, zp: Value, dt: DType, qmin: int, qmax: int,
              axis: int | None) -> Value:
    attrs: dict[str, Any] = {} if axis is None else {"axis": axis % max(x.type.rank, 1)}
    if x.type.dtype is not scale.type.dtype and scale.type.dtype is not DType.f64:
        x = cast(ctx, x, scale.type.dtype)  # PyTorch quantizes float16/bfloat16 inputs in float32
    q = ctx.emit1("quantize_linear", [x, scale, zp], attrs)
    lo, hi = QUANT_RANGES[dt]
    if (qmin, qmax) != (lo, hi):
        q = ctx.emit1("clip", [q, ctx.constant(np.array(qmin, dt.np)), ctx.constant(np.array(qmax, dt.np))])
    return q


def _dequantize(ctx: TorchCtx, q: Value, scale: Value, zp: Value | None, axis: int | None,
                out: DType) -> Value:
    attrs: dict[str, Any] = {} if axis is None else {"axis": axis % max(q.type.rank, 1)}
    if out is not scale.type.dtype:
        attrs["output_dtype"] = out
    return ctx.emit1("dequantize_linear", [q, scale, zp], attrs)


def _out_dtype(ctx: TorchCtx) -> DType:
    od = ctx.kwargs.get("out_dtype")
    return DType.f32 if od is None else torch_dtype(od)


@mapping("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor")
def _quantize_per_tensor(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    qmin, qmax = ctx.arg(3), ctx.arg(4)
    dt = _qtype(ctx, ctx.arg(5), qmin, qmax)
    scale = _scale(ctx, ctx.arg(1))
    if not isinstance(ctx.arg(1), float | int):
        scale = cast(ctx, _scalar_shape(ctx, scale), DType.f32)  # the .tensor form applies scale.item()
    zp = _scalar_shape(ctx, _zero_point(ctx, ctx.arg(2), dt, scale))
    return _quantize(ctx, x, scale, zp, dt, qmin, qmax, None)


@mapping("quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor")
def _dequantize_per_tensor(ctx: TorchCtx) -> Value:
    q = ctx.value(ctx.arg(0))
    dt = _qtype(ctx, ctx.arg(5), ctx.arg(3), ctx.arg(4))
    if q.type.dtype is not dt:
        raise ctx.fail(f"dequantizing a {q.type.dtype} tensor declared as {dt}")
    scale = _scale(ctx, ctx.arg(1))
    if not isinstance(ctx.arg(1), float | int):
        scale = _scalar_shape(ctx, scale)
    zp = _scalar_shape(ctx, _zero_point(ctx, ctx.arg(2), dt, scale))
    return _dequantize(ctx, q, scale, zp, None, _out_dtype(ctx))


@mapping("quantized_decomposed.quantize_per_channel.default")
def _quantize_per_channel(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    qmin, qmax = ctx.arg(4), ctx.arg(5)
    dt = _qtype(ctx, ctx.arg(6), qmin, qmax)
    scale = _scale(ctx, ctx.arg(1))
    zp = _zero_point(ctx, ctx.arg(2), dt, scale)
    return _quantize(ctx, x, scale, zp, dt, qmin, qmax, int(ctx.arg(3)))


@mapping("quantized_decomposed.dequantize_per_channel.default")
def _dequantize_per_channel(ctx: TorchCtx) -> Value:
    q = ctx.value(ctx.arg(0))
    dt = _qtype(ctx, ctx.arg(6), ctx.arg(4), ctx.arg(5))
    if q.type.dtype is not dt:
        raise ctx.fail(f"dequantizing a {q.type.dtype} tensor declared as {dt}")
    scale = _scale(ctx, ctx.arg(1))
    zp = None if ctx.arg(2) is None else _zero_point(ctx, ctx.arg(2), dt, scale)
    return _dequantize(ctx, q, scale, zp, int(ctx.arg(3)), _out_dtype(ctx))


def _fake(ctx: TorchCtx, scale_arg: Any, zp_arg: Any, qmin: Any, qmax: Any, axis: int | None) -> Value:
    x = ctx.value(ctx.arg(0))
    dt = _fake_type(ctx, qmin, qmax)
    scale = _scale(ctx, scale_arg)
    if axis is None and not isinstance(scale_arg, float | int):
        scale = cast(ctx, _scalar_shape(ctx, scale), DType.f32)
    zp = _zero_point(ctx, zp_arg, dt, scale)
    if axis is None:
        zp = _scalar_shape(ctx, zp)
    q = _quantize(ctx, x, scale, zp, dt, qmin, qmax, axis)
    return _dequantize(ctx, q, scale, zp, axis, x.type.dtype)


def _no_mask(ctx: TorchCtx) -> None:
    if 1 in used_results(ctx):
        raise ctx.unsupported("the graph reads the fake-quantize mask, which only training uses; export the model "
                              "in eval mode")


@mapping("aten.fake_quantize_per_tensor_affine.default", "aten.fake_quantize_per_tensor_affine.tensor_qparams")
def _fake_quantize_per_tensor(ctx: TorchCtx) -> Value:
    return _fake(ctx, ctx.arg(1), ctx.arg(2), ctx.arg(3), ctx.arg(4), None)


@mapping("aten.fake_quantize_per_tensor_affine_cachemask.default")
def _fake_quantize_per_tensor_cachemask(ctx: TorchCtx) -> list[Value | None]:
    _no_mask(ctx)
    return [_fake(ctx, ctx.arg(1), ctx.arg(2), ctx.arg(3), ctx.arg(4), None), None]


@mapping("aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default")
def _fake_quantize_tensor_qparams(ctx: TorchCtx) -> list[Value | None]:
    _no_mask(ctx)
    from cuvil.ops.common import const_of

    enabled = const_of(ctx.value(ctx.arg(3)))
    if enabled is None:
        raise ctx.fail("fake_quant_enabled must be a constant of the export")
    if not int(np.asarray(enabled).reshape(-1)[0]):
        return [ctx.value(ctx.arg(0)), None]
    return [_fake(ctx, ctx.arg(1), ctx.arg(2), ctx.arg(4), ctx.arg(5), None), None]


@mapping("aten.fake_quantize_per_channel_affine.default")
def _fake_quantize_per_channel(ctx: TorchCtx) -> Value:
    return _fake(ctx, ctx.arg(1), ctx.arg(2), ctx.arg(4), ctx.arg(5), int(ctx.arg(3)))


@mapping("aten.fake_quantize_per_channel_affine_cachemask.default")
def _fake_quantize_per_channel_cachemask(ctx: TorchCtx) -> list[Value | None]:
    _no_mask(ctx)
    return [_fake(ctx, ctx.arg(1), ctx.arg(2), ctx.arg(4), ctx.arg(5), int(ctx.arg(3))), None]

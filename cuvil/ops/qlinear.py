"""Integer-product ops: ``matmul_integer``, ``conv_integer``, ``qlinear_matmul``,
``qlinear_conv``, and Cuvil's ``qlinear_add`` and ``qlinear_matmul_float``.

They compute exactly in int32 (wrapping, as ONNX's int32 arithmetic), and quantize as
``cuvil/ops/quant.py`` rules 1 and 2 define it:

1. ``matmul_integer(A, B, a_zero_point?, b_zero_point?)``: ``(A - a_zp) @ (B - b_zp)`` as
   int32; A and B are int8 or uint8; ``a_zp`` is per-tensor, ``b_zp`` per-tensor or per
   column (1-D, B's last dim).
2. ``conv_integer(X, W, x_zero_point?, w_zero_point?)``: ``conv(X - x_zp, W - w_zp)`` as
   int32 (``conv``'s attributes); ``w_zp`` per-tensor or per output channel.
3. ``qlinear_matmul`` and ``qlinear_conv``: the integer product as in 1 and 2, plus the
   int32 ``bias`` when given, requantized: ``y = saturate(rint(float32(acc) * m) + y_zp)``
   with the multiplier ``m = a_scale * b_scale / y_scale`` computed in the scales' element
   type (then float32), per output channel (per column of B, per output channel of W) when
   the weight's scale is.  ``relu=1`` (a Cuvil extension, made by the fold-qdq pass) clamps
   below at ``y_zp``: exactly ``quantize(relu(v))``, as quantization is monotonic and maps 0
   to ``y_zp``.  ``qlinear_matmul``'s ``bias`` (1-D, per column) is a Cuvil extension too.
4. ``qlinear_add(A, a_scale, a_zp, B, b_scale, b_zp, y_scale, y_zp)`` (a Cuvil op, made by the
   fold-qdq pass; A, B and Y int8/uint8 of one shape, every scale float32 and every parameter
   per-tensor) is exactly the composition it replaces:
   ``quantize_linear(dequantize_linear(A) + dequantize_linear(B))``, each step in float32 as
   ``cuvil/ops/quant.py`` rules 1 and 2 define it (dequantize, add, divide by ``y_scale``, round half to even,
   saturate).  ``relu=1`` applies ``relu`` to the sum before it is quantized.
5. ``qlinear_matmul_float(A, a_scale, a_zp, B, b_scale, b_zp, bias?)`` (a Cuvil op, made by int8
   post-training quantization for a product whose result stays float32, such as a classifier's logits): the
   integer product as in 1 plus the int32 ``bias`` (per column), dequantized instead of
   requantized: ``y = float32(acc) * (a_scale * b_scale)``, the scale product computed in
   float32 (both scales float32), per column when ``b_scale`` is.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.conv import CONV_ATTRS
from cuvil.ops.linalg import matmul_shape
from cuvil.ops.quant import quantize_values
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, get, register

# integer products ---------------------------------------------------------------------------------

_BYTES = frozenset({DType.i8, DType.u8})


def _per_tensor(ctx: InferCtx, i: int, what: str) -> None:
    if ctx.has(i) and not all(d == 1 for d in ctx.type(i).shape):
        raise ctx.fail(f"{what} must be per-tensor (one element), got {ctx.type(i)}")


def _per_channel(ctx: InferCtx, i: int, length: object, what: str) -> bool:
    """Checks a per-tensor or 1-D per-channel parameter; True when per-channel."""
    if not ctx.has(i):
        return False
    t = ctx.type(i)
    if all(d == 1 for d in t.shape):
        return False
    if t.rank != 1:
        raise ctx.fail(f"{what} must be per-tensor or 1-D per channel, got {t}")
    if isinstance(t.shape[0], int) and isinstance(length, int) and t.shape[0] != length:
        raise ctx.fail(f"{what} has {t.shape[0]} elements, expected {length} (one per output channel)")
    ctx.assume_equal(t.shape[0], length, f"{what} length and output channels")  # type: ignore[arg-type]
    return True


def _same(ctx: InferCtx, i: int, j: int, what: str) -> None:
    if ctx.has(j) and ctx.type(j).dtype is not ctx.type(i).dtype:
        raise ctx.fail(f"{what} has element type {ctx.type(j).dtype}, expected {ctx.type(i).dtype}")


def _conv_geometry(ctx: InferCtx, xi: int, wi: int) -> TensorType:
    """The output type of ``conv`` on inputs ``xi``, ``wi`` (as if they were float32), with its checks."""
    sub = InferCtx(ctx.op, [ctx.type(xi).with_dtype(DType.f32), ctx.type(wi).with_dtype(DType.f32)], [None, None],
                   {k: ctx.attrs[k] for k in CONV_ATTRS}, 1, ctx.symbols)
    (out,) = get("conv").infer(sub)
    ctx.assumptions.extend(sub.assumptions)
    return out


def _conv_i32(x: np.ndarray, w: np.ndarray, attrs: dict[str, object]) -> np.ndarray:
    """The exact convolution of integer arrays, as int32 (float64 sums of these products are exact)."""
    ref = get("conv").reference
    assert ref is not None
    # conv's reference reads only the output's element type
    ctx = RefCtx("conv", [x.astype(np.float64), w.astype(np.float64)], {k: attrs[k] for k in CONV_ATTRS},
                 [TensorType(DType.f64, ())])
    (y,) = ref(ctx)
    return np.asarray(y).astype(np.int64).astype(np.int32)


def _int_operand(x: np.ndarray, zp: np.ndarray | None, channel_axis: int | None = None) -> np.ndarray:
    v = x.astype(np.int64)
    if zp is None:
        return v
    z = zp.astype(np.int64)
    if z.size == 1:
        return v - z.reshape(())
    shape = [1] * v.ndim
    shape[channel_axis if channel_axis is not None else -1] = z.size
    return v - z.reshape(shape)


def _matmul_integer_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, _BYTES)
    ctx.require_dtype(1, _BYTES)
    _same(ctx, 0, 2, "a_zero_point")
    _same(ctx, 1, 3, "b_zero_point")
    _per_tensor(ctx, 2, "a_zero_point")
    a, b = ctx.type(0), ctx.type(1)
    _per_channel(ctx, 3, b.shape[-1] if b.rank else 1, "b_zero_point")
    return [TensorType(DType.i32, matmul_shape(ctx, a.shape, b.shape))]


def _matmul_integer_ref(ctx: RefCtx) -> list[np.ndarray]:
    a = _int_operand(ctx.input(0), ctx.inputs[2] if ctx.has(2) else None)
    b = _int_operand(ctx.input(1), ctx.inputs[3] if ctx.has(3) else None)
    return [np.asarray(np.matmul(a, b)).astype(np.int32)]


register(
    OpDef(
        name="matmul_integer",
        inputs=("A", "B", "a_zero_point?", "b_zero_point?"),
        infer=_matmul_integer_infer,
        reference=_matmul_integer_ref,
        tolerance=0.0,
        doc="(A - a_zero_point) @ (B - b_zero_point) in int32 (ONNX MatMulInteger).",
    )
)


def _conv_integer_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, _BYTES)
    ctx.require_dtype(1, _BYTES)
    _same(ctx, 0, 2, "x_zero_point")
    _same(ctx, 1, 3, "w_zero_point")
    _per_tensor(ctx, 2, "x_zero_point")
    out = _conv_geometry(ctx, 0, 1)
    _per_channel(ctx, 3, ctx.type(1).shape[0], "w_zero_point")
    return [out.with_dtype(DType.i32)]


def _conv_integer_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = _int_operand(ctx.input(0), ctx.inputs[2] if ctx.has(2) else None)
    w = _int_operand(ctx.input(1), ctx.inputs[3] if ctx.has(3) else None, channel_axis=0)
    return [_conv_i32(x, w, ctx.attrs)]


register(
    OpDef(
        name="conv_integer",
        inputs=("X", "W", "x_zero_point?", "w_zero_point?"),
        attrs=CONV_ATTRS,
        infer=_conv_integer_infer,
        reference=_conv_integer_ref,
        tolerance=0.0,
        doc="conv(X - x_zero_point, W - w_zero_point) in int32 (ONNX ConvInteger).",
    )
)


# requantized products: inputs (X, x_scale, x_zp, W, w_scale, w_zp, y_scale, y_zp, bias?) -------------


def _qlinear_common(ctx: InferCtx, channels: object) -> DType:
    """Checks of the scale and zero point operands of qlinear_matmul/conv; returns the output type."""
    ctx.require_dtype(0, _BYTES)
    ctx.require_dtype(3, _BYTES)
    sdt = ctx.require_dtype(1, FLOATS)
    for i, what in ((4, "the weight scale"), (6, "y_scale")):
        if ctx.type(i).dtype is not sdt:
            raise ctx.fail(f"{what} has element type {ctx.type(i).dtype}, the input scale {sdt}")
    _same(ctx, 0, 2, "the input zero point")
    _same(ctx, 3, 5, "the weight zero point")
    for i, what in ((1, "the input scale"), (2, "the input zero point"), (6, "y_scale"), (7, "y_zero_point")):
        _per_tensor(ctx, i, what)
    _per_channel(ctx, 4, channels, "the weight scale")
    _per_channel(ctx, 5, channels, "the weight zero point")
    out = ctx.require_dtype(7, _BYTES)
    if ctx.has(8):
        bias = ctx.type(8)
        if bias.dtype is not DType.i32 or bias.rank != 1:
            raise ctx.fail(f"the bias must be 1-D i32, got {bias}")
        ctx.assume_equal(bias.shape[0], channels, "bias length and output channels")  # type: ignore[arg-type]
    if int(ctx.attrs.get("relu", 0)) not in (0, 1):
        raise ctx.fail(f"relu must be 0 or 1, got {ctx.attrs['relu']}")
    return out


def multiplier(x_scale: np.ndarray, w_scale: np.ndarray, y_scale: np.ndarray) -> np.ndarray:
    """``x_scale * w_scale / y_scale`` in the scales' element type (rounded at each step), as float32."""
    with np.errstate(all="ignore"):
        m = (x_scale.reshape(()) * w_scale.reshape(-1)) / y_scale.reshape(())
    return np.asarray(m.astype(np.float32)).reshape(-1)


def requantize(acc: np.ndarray, m: np.ndarray, y_zp: np.ndarray, out: DType, relu: bool) -> np.ndarray:
    """Rule 3: ``saturate(rint(float32(acc) * m) + y_zp)``, clamped below at ``y_zp`` with ``relu``."""
    with np.errstate(all="ignore"):
        q = acc.astype(np.float32) * m
    zp = int(y_zp.reshape(-1)[0])
    y = quantize_values(q, zp, out)
    return np.maximum(y, np.asarray(zp, out.np)) if relu else y


_QLINEAR_INPUTS = ("X", "x_scale", "x_zero_point", "W", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "bias?")


def _qlinear_matmul_infer(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.type(0), ctx.type(3)
    if b.rank < 1:
        raise ctx.fail("B must have rank >= 1")
    out = _qlinear_common(ctx, b.shape[-1])
    return [TensorType(out, matmul_shape(ctx, a.shape, b.shape))]


def _qlinear_matmul_ref(ctx: RefCtx) -> list[np.ndarray]:
    a = _int_operand(ctx.input(0), ctx.input(2))
    b = _int_operand(ctx.input(3), ctx.input(5))
    acc = np.asarray(np.matmul(a, b))
    if ctx.has(8):
        acc = acc + ctx.input(8).astype(np.int64)
    acc = acc.astype(np.int32)
    m = multiplier(ctx.input(1), ctx.input(4), ctx.input(6))
    return [requantize(acc, m, ctx.input(7), ctx.out_types[0].dtype, bool(ctx.attrs["relu"]))]


register(
    OpDef(
        name="qlinear_matmul",
        inputs=_QLINEAR_INPUTS,
        attrs={"relu": AttrSpec("int", 0)},
        infer=_qlinear_matmul_infer,
        reference=_qlinear_matmul_ref,
        tolerance=0.0,
        doc="Quantized matmul requantized to y's scale and zero point (ONNX QLinearMatMul, plus bias and relu).",
    )
)


def _qlinear_conv_infer(ctx: InferCtx) -> list[TensorType]:
    out = _conv_geometry(ctx, 0, 3)
    dt = _qlinear_common(ctx, ctx.type(3).shape[0])
    return [out.with_dtype(dt)]


def _qlinear_conv_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = _int_operand(ctx.input(0), ctx.input(2))
    w = _int_operand(ctx.input(3), ctx.input(5), channel_axis=0)
    acc = _conv_i32(x, w, ctx.attrs).astype(np.int64)
    if ctx.has(8):
        acc = acc + ctx.input(8).astype(np.int64).reshape((1, -1) + (1,) * (acc.ndim - 2))
    acc = acc.astype(np.int32)
    m = multiplier(ctx.input(1), ctx.input(4), ctx.input(6))
    m = m.reshape((1, -1) + (1,) * (acc.ndim - 2)) if m.size > 1 else m.reshape(())
    return [requantize(acc, m, ctx.input(7), ctx.out_types[0].dtype, bool(ctx.attrs["relu"]))]


register(
    OpDef(
        name="qlinear_conv",
        inputs=_QLINEAR_INPUTS,
        attrs={**CONV_ATTRS, "relu": AttrSpec("int", 0)},
        infer=_qlinear_conv_infer,
        reference=_qlinear_conv_ref,
        tolerance=0.0,
        doc="Quantized convolution requantized to y's scale and zero point (ONNX QLinearConv, plus relu).",
    )
)


# quantized elementwise add: inputs (A, a_scale, a_zero_point, B, b_scale, b_zero_point, y_scale, y_zero_point) ---


def _qlinear_add_infer(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.type(0), ctx.type(3)
    ctx.require_dtype(0, _BYTES)
    ctx.require_dtype(3, _BYTES)
    _same(ctx, 0, 2, "the zero point of A")
    _same(ctx, 3, 5, "the zero point of B")
    for i, what in ((1, "the scale of A"), (4, "the scale of B"), (6, "y_scale")):
        if ctx.type(i).dtype is not DType.f32:
            raise ctx.fail(f"{what} must be f32, got {ctx.type(i).dtype}")
    for i, what in ((1, "the scale of A"), (2, "the zero point of A"), (4, "the scale of B"),
                    (5, "the zero point of B"), (6, "y_scale"), (7, "y_zero_point")):
        _per_tensor(ctx, i, what)
    if a.rank != b.rank:
        raise ctx.fail(f"A {a} and B {b} must have one shape")
    for i, (da, db) in enumerate(zip(a.shape, b.shape)):
        if isinstance(da, int) and isinstance(db, int) and da != db:
            raise ctx.fail(f"A {a} and B {b} must have one shape")
        ctx.assume_equal(da, db, f"dim {i} of A and B")
    out = ctx.require_dtype(7, _BYTES)
    if int(ctx.attrs.get("relu", 0)) not in (0, 1):
        raise ctx.fail(f"relu must be 0 or 1, got {ctx.attrs['relu']}")
    return [TensorType(out, a.shape)]


def _qlinear_add_ref(ctx: RefCtx) -> list[np.ndarray]:
    f = np.float32

    def dequantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray) -> np.ndarray:
        return (x.astype(f) - zp.astype(f).reshape(())) * s.astype(f).reshape(())  # quant.py rule 2, in float32

    total = dequantize(ctx.input(0), ctx.input(1), ctx.input(2)) + dequantize(ctx.input(3), ctx.input(4), ctx.input(5))
    if ctx.attrs["relu"]:
        total = np.maximum(total, f(0))
    with np.errstate(all="ignore"):
        q = total / ctx.input(6).astype(f).reshape(())  # quant.py rule 1, dividing in the scale's type
    return [quantize_values(q, ctx.input(7).reshape(()), ctx.out_types[0].dtype)]


register(
    OpDef(
        name="qlinear_add",
        inputs=("A", "a_scale", "a_zero_point", "B", "b_scale", "b_zero_point", "y_scale", "y_zero_point"),
        attrs={"relu": AttrSpec("int", 0)},
        infer=_qlinear_add_infer,
        reference=_qlinear_add_ref,
        tolerance=0.0,
        doc="quantize(dequantize(A) + dequantize(B)) in float32, optionally through relu (made by fold-qdq).",
    )
)


# a product dequantized to float32: inputs (X, x_scale, x_zp, W, w_scale, w_zp, bias?) ----------------------


def _qlinear_matmul_float_infer(ctx: InferCtx) -> list[TensorType]:
    a, b = ctx.type(0), ctx.type(3)
    if b.rank < 1:
        raise ctx.fail("B must have rank >= 1")
    ctx.require_dtype(0, _BYTES)
    ctx.require_dtype(3, _BYTES)
    for i, what in ((1, "the input scale"), (4, "the weight scale")):
        if ctx.type(i).dtype is not DType.f32:
            raise ctx.fail(f"{what} must be f32, got {ctx.type(i).dtype}")
    _same(ctx, 0, 2, "the input zero point")
    _same(ctx, 3, 5, "the weight zero point")
    _per_tensor(ctx, 1, "the input scale")
    _per_tensor(ctx, 2, "the input zero point")
    _per_channel(ctx, 4, b.shape[-1], "the weight scale")
    _per_channel(ctx, 5, b.shape[-1], "the weight zero point")
    if ctx.has(6):
        bias = ctx.type(6)
        if bias.dtype is not DType.i32 or bias.rank != 1:
            raise ctx.fail(f"the bias must be 1-D i32, got {bias}")
        ctx.assume_equal(bias.shape[0], b.shape[-1], "bias length and output channels")
    return [TensorType(DType.f32, matmul_shape(ctx, a.shape, b.shape))]


def _qlinear_matmul_float_ref(ctx: RefCtx) -> list[np.ndarray]:
    a = _int_operand(ctx.input(0), ctx.input(2))
    b = _int_operand(ctx.input(3), ctx.input(5))
    acc = np.asarray(np.matmul(a, b))
    if ctx.has(6):
        acc = acc + ctx.input(6).astype(np.int64)
    acc = acc.astype(np.int32)  # wrapping, as the kernels' int32 sums
    with np.errstate(all="ignore"):
        s = (ctx.input(1).reshape(()) * ctx.input(4).reshape(-1)).astype(np.float32)
        return [np.asarray(acc.astype(np.float32) * s, np.float32)]


register(
    OpDef(
        name="qlinear_matmul_float",
        inputs=("X", "x_scale", "x_zero_point", "W", "w_scale", "w_zero_point", "bias?"),
        infer=_qlinear_matmul_float_infer,
        reference=_qlinear_matmul_float_ref,
        tolerance=0.0,
        doc="Quantized matmul (plus int32 bias) dequantized to float32 at x_scale * w_scale (made by fold-qdq).",
    )
)

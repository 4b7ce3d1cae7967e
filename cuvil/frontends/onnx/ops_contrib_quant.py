"""Importers of the ``com.microsoft`` quantized ops that onnxruntime's quantization tools write into
models (``quantize_dynamic``; ``quantize_static`` with ``QuantFormat.QOperator``; the fusions its graph
optimizer saves), decomposed into Cuvil's quantization ops (``cuvil/ops/quant.py``, ``qlinear.py``) so
every target runs them and the fold-qdq pass fuses them where it can.

The semantics are the ones onnxruntime documents.  Unless said otherwise every scale is a float32
scalar (per tensor), the 8-bit tensors are int8 or uint8, and an absent zero point is 0 of the
quantized type; ``dequantize``/``quantize`` are ``dequantize_linear``/``quantize_linear``
(float32, round half to even, saturate):

1. QLinearAdd, QLinearMul: ``C = quantize(dequantize(A) + dequantize(B))`` (``*`` for Mul), with
   NumPy broadcasting.  onnxruntime's SIMD kernels multiply by the scale ratios (``A_scale / C_scale``)
   in fixed point instead, so a value within a rounding of a tie can come out one step apart.
2. QLinearSigmoid, QLinearLeakyRelu (``alpha``, default 0.01): ``Y = quantize(f(dequantize(X)))``,
   looked up, as onnxruntime does, in a 256-entry table of ``f`` on every value of the type
   (computed at compile time when the scales and zero points are constants): one ``gather``.
3. QLinearConcat(Y_scale, Y_zero_point, X0, X0_scale, X0_zero_point, ...; ``axis``): each input
   requantized to Y's parameters: ``quantize(concat(dequantize(Xi)))``.
4. QLinearGlobalAveragePool, QLinearAveragePool (AveragePool's attributes): ``quantize(pool(dequantize(X)))``;
   ``channels_last=1`` reads and writes ``[N, spatial..., C]`` (transposed around the pool).  The
   pool is ONNX AveragePool's: with ``ceil_mode`` and ``count_include_pad`` a last window reaching past
   the padding divides by the elements it covers, as onnxruntime's float AveragePool and PyTorch do
   (onnxruntime's QLinearAveragePool divides it by the whole kernel).
5. QLinearSoftmax (``opset``, ``axis``): ``quantize(softmax(dequantize(X)))``, the softmax of that
   ONNX opset (before 13: over the 2-D view from ``axis``, default 1; else along ``axis``, default -1).
   onnxruntime requantizes with the integer ``floor(1 / y_scale)``; for the ``y_scale = 1/256`` its
   quantizer writes that is the same multiplier.
6. QGemm (``alpha``, ``transA``, ``transB``; ``C`` an int32 bias added to the accumulator):
   ``(A - a_zp) @ (B - b_zp) + C``, with ``y_scale`` requantized at ``alpha * a_scale * b_scale /
   y_scale`` (``qlinear_matmul``), else dequantized to float32 at ``alpha * a_scale * b_scale``
   (``qlinear_matmul_float``); ``b_scale``/``b_zero_point`` may be per column.
7. MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zp?, b_zp?, bias?): ``float32((A - a_zp) @ (B - b_zp))
   * (a_scale * b_scale) + bias`` (``qlinear_matmul_float``; ``b_scale`` may be per column).
8. DynamicQuantizeMatMul(A, B, b_scale, b_zp?, bias?): ``A`` (float32) quantized to uint8 by
   ``dynamic_quantize_linear`` (range including 0, asymmetric), then as 7.
9. DynamicQuantizeLSTM: ONNX LSTM (imported by ``ops_rnn.py``) whose ``W`` ``[dirs, input, 4*hidden]``
   and ``R`` ``[dirs, hidden, 4*hidden]`` are 8-bit with scales and zero points of shape ``[dirs]`` or
   ``[dirs, 4*hidden]`` (per gate column): they are dequantized (at compile time when constants) and
   transposed to LSTM's layout.  As onnxruntime's kernel does, ``X`` is quantized dynamically (uint8,
   over the whole tensor) before its product with ``W``: ``X`` is replaced by
   ``dequantize(dynamic_quantize_linear(X))``.  onnxruntime also quantizes the hidden state of every
   step before its product with ``R``, in groups of batch rows whose size follows its thread count;
   Cuvil keeps that product in float32 (the recurrence is ``ops_rnn.py``'s), so results differ from
   onnxruntime's by that rounding of ``H`` (half a step of ``H``'s range / 255 per element at most).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

MS = "com.microsoft"
_BYTES = (DType.i8, DType.u8)


# operands -----------------------------------------------------------------------------------------


def _required(ctx: ImportCtx, i: int, what: str) -> Value:
    v = ctx.input(i)
    if v is None:
        raise ctx.fail(f"input {i} ({what}) is required")
    return v


def _quantized(ctx: ImportCtx, i: int, what: str, like: DType | None = None) -> Value:
    """Input ``i``, an int8/uint8 tensor (of type ``like`` when given)."""
    v = _required(ctx, i, what)
    dt = v.type.dtype
    if dt not in _BYTES or (like is not None and dt is not like):
        want = str(like) if like is not None else "i8 or u8"
        raise ctx.fail(f"{what} must be {want}, got {v.type}")
    return v


def _per_tensor(ctx: ImportCtx, v: Value, what: str) -> None:
    if not all(d == 1 for d in v.type.shape):
        raise ctx.fail(f"{what} must be a scalar (per tensor), got {v.type}")


def _scale(ctx: ImportCtx, i: int, what: str, *, per_tensor: bool = True) -> Value:
    v = _required(ctx, i, what)
    if v.type.dtype is not DType.f32:
        raise ctx.unsupported(f"{what} of type {v.type.dtype} (float32 scales only)")
    if per_tensor:
        _per_tensor(ctx, v, what)
    return v


def _zero_point(ctx: ImportCtx, i: int, dtype: DType, what: str, *, per_tensor: bool = True) -> Value:
    """Input ``i``, or a zero of ``dtype`` when it is absent."""
    v = ctx.input(i)
    if v is None:
        return ctx.constant(np.zeros((), dtype.np))
    if v.type.dtype is not dtype:
        raise ctx.fail(f"{what} must be {dtype}, got {v.type}")
    if per_tensor:
        _per_tensor(ctx, v, what)
    return v


def _dequantize(ctx: ImportCtx, x: Value, scale: Value, zp: Value) -> Value:
    return ctx.emit1("dequantize_linear", [x, scale, zp])


def _quantize(ctx: ImportCtx, y: Value, scale: Value, zp: Value) -> Value:
    return ctx.emit1("quantize_linear", [y, scale, zp])


def _dq_input(ctx: ImportCtx, i: int, what: str, like: DType | None = None) -> tuple[Value, DType]:
    """``dequantize`` of input ``i`` with the scale and zero point at ``i + 1``, ``i + 2``; and its type."""
    x = _quantized(ctx, i, what, like)
    dt = x.type.dtype
    return _dequantize(ctx, x, _scale(ctx, i + 1, f"{what}'s scale"),
                       _zero_point(ctx, i + 2, dt, f"{what}'s zero point")), dt


def _requantized(ctx: ImportCtx, y: Value, i: int, dt: DType) -> Value:
    """``quantize`` of ``y`` with the scale and zero point at inputs ``i``, ``i + 1``."""
    return _quantize(ctx, y, _scale(ctx, i, "the output scale"), _zero_point(ctx, i + 1, dt, "the output zero point"))


# 1. elementwise binary ----------------------------------------------------------------------------


def _binary(op_type: str, op: str) -> None:
    @importer(op_type, domain=MS)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        known_attrs(ctx, ())
        a, dt = _dq_input(ctx, 0, "A")
        b, _ = _dq_input(ctx, 3, "B", dt)
        return [_requantized(ctx, ctx.emit1(op, [a, b]), 6, dt)]


_binary("QLinearAdd", "add")
_binary("QLinearMul", "mul")


# 2. lookup tables ---------------------------------------------------------------------------------


def _lookup(ctx: ImportCtx, f: Callable[[Value], Value]) -> Value:
    """``quantize(f(dequantize(X)))`` as a gather from the table of ``f`` on every 8-bit value."""
    x = _quantized(ctx, 0, "X")
    dt = x.type.dtype
    # entry i is the value whose bits are i: for int8 the values from 128 on are negative, and a
    # negative index counts from the table's end, so the int8 value itself indexes it
    domain = ctx.constant(np.arange(256, dtype=np.uint8).view(dt.np))
    xs, xz = _scale(ctx, 1, "X_scale"), _zero_point(ctx, 2, dt, "X_zero_point")
    table = _requantized(ctx, f(_dequantize(ctx, domain, xs, xz)), 3, dt)
    index = ctx.emit1("cast", [x], {"to": DType.i32})
    return ctx.emit1("gather", [table, index], {"axis": 0})


@importer("QLinearSigmoid", domain=MS)
def _qlinear_sigmoid(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    return [_lookup(ctx, lambda v: ctx.emit1("sigmoid", [v]))]


@importer("QLinearLeakyRelu", domain=MS)
def _qlinear_leaky_relu(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("alpha",))
    alpha = float(ctx.attr("alpha", 0.01))
    return [_lookup(ctx, lambda v: ctx.emit1("leaky_relu", [v], {"alpha": alpha}))]


# 3. concat ----------------------------------------------------------------------------------------


@importer("QLinearConcat", domain=MS)
def _qlinear_concat(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("axis",))
    if "axis" not in ctx.attrs:
        raise ctx.fail("the attribute 'axis' is required")
    n = ctx.num_inputs
    if n < 5 or (n - 2) % 3:
        raise ctx.fail(f"takes Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got {n} inputs")
    dt = _quantized(ctx, 2, "input 0").type.dtype
    parts = [_dq_input(ctx, i, f"input {(i - 2) // 3}", dt)[0] for i in range(2, n, 3)]
    joined = ctx.emit1("concat", parts, {"axis": int(ctx.attrs["axis"])})
    return [_requantized(ctx, joined, 0, dt)]


# 4. pools -----------------------------------------------------------------------------------------


def _pooled(ctx: ImportCtx, pool: Callable[[Value], Value]) -> Value:
    """``quantize(pool(dequantize(X)))`` with X, x_scale, x_zero_point, y_scale, y_zero_point, in
    ``channels_last`` layout when asked."""
    channels_last = int(ctx.attr("channels_last", 0))
    if channels_last not in (0, 1):
        raise ctx.fail(f"channels_last must be 0 or 1, got {channels_last}")
    x, dt = _dq_input(ctx, 0, "X")
    r = x.type.rank
    if r < 3:
        raise ctx.fail(f"X must have a batch, a channel and at least one spatial dim, got {x.type}")
    if channels_last:
        x = ctx.emit1("transpose", [x], {"perm": [0, r - 1, *range(1, r - 1)]})
    y = pool(x)
    if channels_last:
        y = ctx.emit1("transpose", [y], {"perm": [0, *range(2, r), 1]})
    return _requantized(ctx, y, 3, dt)


@importer("QLinearGlobalAveragePool", domain=MS)
def _qlinear_global_average_pool(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("channels_last",))
    return [_pooled(ctx, lambda v: ctx.emit1("global_average_pool", [v]))]


_AVERAGE_POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides")


@importer("QLinearAveragePool", domain=MS)
def _qlinear_average_pool(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, (*_AVERAGE_POOL_ATTRS, "channels_last"))
    attrs = {k: v for k, v in ctx.attrs.items() if k in _AVERAGE_POOL_ATTRS}
    return [_pooled(ctx, lambda v: ctx.emit1("average_pool", [v], attrs))]


# 5. softmax ---------------------------------------------------------------------------------------


@importer("QLinearSoftmax", domain=MS)
def _qlinear_softmax(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("axis", "opset"))
    if "opset" not in ctx.attrs:
        raise ctx.fail("the attribute 'opset' (the Softmax opset it follows) is required")
    if int(ctx.attrs["opset"]) < 13:
        attrs = {"axis": int(ctx.attr("axis", 1)), "coerce_2d": 1}
    else:
        attrs = {"axis": int(ctx.attr("axis", -1))}
    x, dt = _dq_input(ctx, 0, "X")
    return [_requantized(ctx, ctx.emit1("softmax", [x], attrs), 3, dt)]


# 6.-8. products -----------------------------------------------------------------------------------


def _weight_params(ctx: ImportCtx, b: Value, si: int, zi: int) -> tuple[Value, Value]:
    """B's scale and zero point (inputs ``si``, ``zi``): per tensor or per column."""
    scale = _scale(ctx, si, "b_scale", per_tensor=False)
    zp = _zero_point(ctx, zi, b.type.dtype, "b_zero_point", per_tensor=False)
    for v, what in ((scale, "b_scale"), (zp, "b_zero_point")):
        if v.type.rank > 1 or (v.type.rank == 1 and v.type.shape[0] not in (1, b.type.shape[-1])):
            raise ctx.fail(f"{what} must be a scalar or one per column of B {b.type}, got {v.type}")
    return scale, zp


def _float_product(ctx: ImportCtx, a: Value, a_scale: Value, a_zp: Value, b: Value, b_scale: Value, b_zp: Value,
                   bias: Value | None) -> Value:
    y = ctx.emit1("qlinear_matmul_float", [a, a_scale, a_zp, b, b_scale, b_zp])
    if bias is None:
        return y
    if bias.type.dtype is not DType.f32:
        raise ctx.fail(f"the bias must be float32, got {bias.type}")
    return ctx.emit1("add", [y, bias])


@importer("MatMulIntegerToFloat", domain=MS)
def _matmul_integer_to_float(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    a = _quantized(ctx, 0, "A")
    b = _quantized(ctx, 1, "B")
    a_scale = _scale(ctx, 2, "a_scale")
    b_scale, b_zp = _weight_params(ctx, b, 3, 5)
    a_zp = _zero_point(ctx, 4, a.type.dtype, "a_zero_point")
    return [_float_product(ctx, a, a_scale, a_zp, b, b_scale, b_zp, ctx.input(6))]


@importer("DynamicQuantizeMatMul", domain=MS)
def _dynamic_quantize_matmul(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    a = _required(ctx, 0, "A")
    if a.type.dtype is not DType.f32:
        raise ctx.fail(f"A must be float32, got {a.type}")
    b = _quantized(ctx, 1, "B")
    b_scale, b_zp = _weight_params(ctx, b, 2, 3)
    aq, a_scale, a_zp = ctx.emit("dynamic_quantize_linear", [a], num_outputs=3)
    return [_float_product(ctx, aq, a_scale, a_zp, b, b_scale, b_zp, ctx.input(4))]


@importer("QGemm", domain=MS)
def _qgemm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("alpha", "transA", "transB"))
    a = _quantized(ctx, 0, "A")
    b = _quantized(ctx, 3, "B")
    if a.type.rank != 2 or b.type.rank != 2:
        raise ctx.fail(f"A and B must be 2-D, got {a.type} and {b.type}")
    for flag in ("transA", "transB"):
        if int(ctx.attr(flag, 0)) not in (0, 1):
            raise ctx.fail(f"{flag} must be 0 or 1, got {ctx.attr(flag)}")
    if int(ctx.attr("transA", 0)):
        a = ctx.emit1("transpose", [a], {"perm": [1, 0]})
    if int(ctx.attr("transB", 0)):
        b = ctx.emit1("transpose", [b], {"perm": [1, 0]})
    a_scale = _scale(ctx, 1, "a_scale")
    a_zp = _zero_point(ctx, 2, a.type.dtype, "a_zero_point")
    b_scale, b_zp = _weight_params(ctx, b, 4, 5)
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha != 1.0:  # onnxruntime's multiplier is (alpha * a_scale) * b_scale [/ y_scale], in float32
        a_scale = ctx.emit1("mul", [ctx.constant(np.float32(alpha)), a_scale])
    c, y_scale, y_zp = ctx.input(6), ctx.input(7), ctx.input(8)
    if (y_scale is None) != (y_zp is None):
        raise ctx.fail("y_scale and y_zero_point are given together (a quantized Y) or not at all (a float32 Y)")
    if y_scale is not None:
        y_scale = _scale(ctx, 7, "y_scale")
        y_zp = _zero_point(ctx, 8, _quantized(ctx, 8, "y_zero_point").type.dtype, "y_zero_point")
    bias = _column_bias(ctx, c, a, b)
    if c is not None and bias is None:  # a bias per row or per element: the integer product, then the steps
        return [_qgemm_general(ctx, a, a_scale, a_zp, b, b_scale, b_zp, c, y_scale, y_zp)]
    if y_scale is None:
        return [ctx.emit1("qlinear_matmul_float", [a, a_scale, a_zp, b, b_scale, b_zp, bias])]
    return [ctx.emit1("qlinear_matmul", [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp, bias])]


def _column_bias(ctx: ImportCtx, c: Value | None, a: Value, b: Value) -> Value | None:
    """QGemm's int32 ``C`` as one bias per column ``[N]`` when it is one (a scalar, ``[N]`` or ``[1, N]``)."""
    if c is None:
        return None
    if c.type.dtype is not DType.i32:
        raise ctx.fail(f"C must be int32, got {c.type}")
    n = b.type.shape[1]
    shape = c.type.shape
    if len(shape) > 2:
        raise ctx.fail(f"C must broadcast to [M, N] = [{a.type.shape[0]}, {n}], got {c.type}")
    if not isinstance(n, int) or any(d != 1 for d in shape[:-1]):
        return None
    if not shape or shape[-1] == 1:
        return ctx.emit1("expand", [ctx.emit1("reshape", [c, ctx.constant(np.array([1], np.int64))]),
                                    ctx.constant(np.array([n], np.int64))])
    if shape[-1] != n:
        raise ctx.fail(f"C must broadcast to [M, N] = [{a.type.shape[0]}, {n}], got {c.type}")
    return ctx.emit1("reshape", [c, ctx.constant(np.array([n], np.int64))]) if len(shape) == 2 else c


def _qgemm_general(ctx: ImportCtx, a: Value, a_scale: Value, a_zp: Value, b: Value, b_scale: Value, b_zp: Value,
                   c: Value, y_scale: Value | None, y_zp: Value | None) -> Value:
    """QGemm with a ``C`` of shape ``[M, 1]`` or ``[M, N]``: ``matmul_integer``, ``+ C`` in int32, then
    ``float32(acc) * multiplier`` (quantized with scale 1 and ``y_zp`` when Y is)."""
    acc = ctx.emit1("add", [ctx.emit1("matmul_integer", [a, b, a_zp, b_zp]), c])
    m = ctx.emit1("mul", [a_scale, b_scale])
    if y_scale is not None:
        m = ctx.emit1("div", [m, y_scale])
    y = ctx.emit1("mul", [ctx.emit1("cast", [acc], {"to": DType.f32}), m])
    if y_scale is None or y_zp is None:
        return y
    return _quantize(ctx, y, ctx.constant(np.float32(1.0)), y_zp)


# 9. DynamicQuantizeLSTM ---------------------------------------------------------------------------

_LSTM_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
               "input_forget")


def _lstm_weight(ctx: ImportCtx, wi: int, what: str) -> Value:
    """W (input 1, its scale and zero point inputs 8, 9) or R (input 2; 10, 11), ``[dirs, K, 4*hidden]``
    and 8-bit, dequantized and transposed to LSTM's ``[dirs, 4*hidden, K]``."""
    w = _quantized(ctx, wi, what)
    si = 8 if wi == 1 else 10
    scale = _scale(ctx, si, f"{what}_scale", per_tensor=False)
    zp = _zero_point(ctx, si + 1, w.type.dtype, f"{what}_zero_point", per_tensor=False)
    if w.type.rank != 3:
        raise ctx.fail(f"{what} must be 3-D [num_directions, K, 4*hidden_size], got {w.type}")
    dirs, cols = w.type.shape[0], w.type.shape[2]
    for v, name in ((scale, f"{what}_scale"), (zp, f"{what}_zero_point")):
        ok = v.type.shape in ((dirs,), (dirs, cols))
        if not ok:
            raise ctx.fail(f"{name} must be [num_directions] or [num_directions, 4*hidden_size] for {what} {w.type}, "
                           f"got {v.type}")
    wc, sc, zc = ctx.const_input(wi), ctx.const_input(si), ctx.const_input(si + 1)
    if wc is not None and sc is not None and zc is not None:
        nd = wc.shape[0]
        f = (wc.astype(np.float32) - zc.astype(np.float32).reshape(nd, 1, -1)) * sc.reshape(nd, 1, -1)
        return ctx.constant(np.ascontiguousarray(f.astype(np.float32).transpose(0, 2, 1)))
    if not isinstance(dirs, int):
        raise ctx.fail(f"{what} must have a static number of directions, got {w.type}")
    per_dir = ctx.constant(np.array([dirs, 1, -1], np.int64))
    wf = ctx.emit1("cast", [w], {"to": DType.f32})
    zf = ctx.emit1("reshape", [ctx.emit1("cast", [zp], {"to": DType.f32}), per_dir])
    f = ctx.emit1("mul", [ctx.emit1("sub", [wf, zf]), ctx.emit1("reshape", [scale, per_dir])])
    return ctx.emit1("transpose", [f], {"perm": [0, 2, 1]})


@importer("DynamicQuantizeLSTM", domain=MS)
def _dynamic_quantize_lstm(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, _LSTM_ATTRS)
    x = _required(ctx, 0, "X")
    if x.type.dtype is not DType.f32:
        raise ctx.fail(f"X must be float32, got {x.type}")
    w, r = _lstm_weight(ctx, 1, "W"), _lstm_weight(ctx, 2, "R")
    xq, xs, xz = ctx.emit("dynamic_quantize_linear", [x], num_outputs=3)
    xf = _dequantize(ctx, xq, xs, xz)
    return ctx.import_as("LSTM", [xf, w, r, *(ctx.input(i) for i in range(3, 8))])

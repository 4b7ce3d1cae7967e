"""Importers of ONNX's quantization ops onto Cuvil's (``cuvil/ops/quant.py``, ``cuvil/ops/qlinear.py``).

Every opset form maps onto the newest semantics:

* QuantizeLinear/DequantizeLinear-10 take a scalar scale only (per-axis came
  with opset 13): a larger scale is refused as malformed;
* ``saturate`` (opset 19) only changes float8 results: it passes through when
  it is 0;
* ``block_size`` (21), ``output_dtype`` (21 for QuantizeLinear, 23 for
  DequantizeLinear) and ``precision`` (23) pass through, element types
  translated (int4, uint4, int2, uint2, the float8 types and float4 included);
  a type Cuvil lacks (float8e8m0, float6 ...) is refused by name;
* QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger and
  DynamicQuantizeLinear have kept their meaning since they appeared.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from cuvil.errors import UnsupportedOpError
from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.frontends.onnx.ops_elementwise import first_opset, input_value
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ops.conv import CONV_ATTRS

_PER_AXIS_SINCE = 13


def _elem(ctx: ImportCtx, attr: str) -> DType | None:
    code = ctx.attr(attr, 0)
    if not code:
        return None
    if code not in onnx.TensorProto.DataType.values():
        raise ctx.fail(f"{attr} is not an ONNX element type: {code}")
    try:
        return dtype_of(code, f"node {ctx.name!r}")
    except UnsupportedOpError:
        raise ctx.unsupported(f"{attr}={onnx.TensorProto.DataType.Name(code)}") from None


def _check_attrs(ctx: ImportCtx, known: Sequence[str]) -> None:
    unknown = sorted(set(ctx.attrs) - set(known))
    if unknown:
        raise ctx.fail(f"unknown attribute(s) {', '.join(unknown)}")


def _linear_attrs(ctx: ImportCtx, quantize: bool) -> dict[str, Any]:
    known = ["axis", "block_size", "output_dtype"] + (["saturate", "precision"] if quantize else [])
    _check_attrs(ctx, known)
    if ctx.attr("saturate", 1) not in (0, 1):
        raise ctx.fail(f"saturate must be 0 or 1, got {ctx.attr('saturate')}")
    scale = input_value(ctx, 1)
    if ctx.opset < _PER_AXIS_SINCE and not all(d == 1 for d in scale.type.shape):
        raise ctx.fail(f"opset {ctx.opset} takes a per-tensor (one element) scale, got {scale.type}")
    attrs: dict[str, Any] = {"axis": int(ctx.attr("axis", 1)), "block_size": int(ctx.attr("block_size", 0))}
    out = _elem(ctx, "output_dtype")
    if out is not None:
        attrs["output_dtype"] = out
    if quantize and (prec := _elem(ctx, "precision")) is not None:
        attrs["precision"] = prec
    if quantize and ctx.attr("saturate", 1) == 0:
        attrs["saturate"] = 0
    return attrs


@importer("QuantizeLinear", since=first_opset("QuantizeLinear"))
def _quantize(ctx: ImportCtx) -> Sequence[Value | None]:
    attrs = _linear_attrs(ctx, quantize=True)
    return [ctx.emit1("quantize_linear", [input_value(ctx, 0), input_value(ctx, 1), ctx.input(2)], attrs)]


@importer("DequantizeLinear", since=first_opset("DequantizeLinear"))
def _dequantize(ctx: ImportCtx) -> Sequence[Value | None]:
    attrs = _linear_attrs(ctx, quantize=False)
    return [ctx.emit1("dequantize_linear", [input_value(ctx, 0), input_value(ctx, 1), ctx.input(2)], attrs)]


@importer("DynamicQuantizeLinear", since=first_opset("DynamicQuantizeLinear"))
def _dynamic(ctx: ImportCtx) -> Sequence[Value | None]:
    _check_attrs(ctx, ())
    return ctx.emit("dynamic_quantize_linear", [input_value(ctx, 0)], num_outputs=3)


def _conv_attrs(ctx: ImportCtx, extra: Sequence[str] = ()) -> dict[str, Any]:
    _check_attrs(ctx, [*CONV_ATTRS, *extra])
    return {k: v for k, v in ctx.attrs.items() if k in CONV_ATTRS}


@importer("MatMulInteger", since=first_opset("MatMulInteger"))
def _matmul_integer(ctx: ImportCtx) -> Sequence[Value | None]:
    _check_attrs(ctx, ())
    return [ctx.emit1("matmul_integer", [input_value(ctx, 0), input_value(ctx, 1), ctx.input(2), ctx.input(3)])]


@importer("ConvInteger", since=first_opset("ConvInteger"))
def _conv_integer(ctx: ImportCtx) -> Sequence[Value | None]:
    attrs = _conv_attrs(ctx)
    return [ctx.emit1("conv_integer", [input_value(ctx, 0), input_value(ctx, 1), ctx.input(2), ctx.input(3)], attrs)]


@importer("QLinearMatMul", since=first_opset("QLinearMatMul"))
def _qlinear_matmul(ctx: ImportCtx) -> Sequence[Value | None]:
    _check_attrs(ctx, ())
    return [ctx.emit1("qlinear_matmul", [input_value(ctx, i) for i in range(8)])]


@importer("QLinearConv", since=first_opset("QLinearConv"))
def _qlinear_conv(ctx: ImportCtx) -> Sequence[Value | None]:
    attrs = _conv_attrs(ctx)
    return [ctx.emit1("qlinear_conv", [*(input_value(ctx, i) for i in range(8)), ctx.input(8)], attrs)]

"""Importers of ONNX activation functions and Clip; Swish and SwiGLU become ``x * sigmoid(alpha * x)``
(times the value input), as ONNX's function bodies for them write it.

Older forms upgraded here: ``consumed_inputs`` (opset < 6) is dropped; Selu's
opset-1 defaults (shorter constants) are kept for opset-1 models; Clip's
``min``/``max`` attributes (opset < 11) become constant inputs, with opset 6's
defaults of the float range's ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_elementwise import binary_op, first_opset, input_value, modern_attrs, unary_op
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value

for _onnx, _cuvil in {
    "Relu": "relu",
    "LeakyRelu": "leaky_relu",
    "Elu": "elu",
    "Celu": "celu",
    "ThresholdedRelu": "thresholded_relu",
    "Sigmoid": "sigmoid",
    "HardSigmoid": "hard_sigmoid",
    "HardSwish": "hard_swish",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "Mish": "mish",
    "Gelu": "gelu",
    "Shrink": "shrink",
}.items():
    unary_op(_onnx, _cuvil)

# Selu-1's defaults are 1.6732 and 1.0507 (as float32); opset 6 gave the full constants.
unary_op("Selu", "selu", v1_defaults={"alpha": float(np.float32(1.6732)), "gamma": float(np.float32(1.0507))})

# PRelu never had the broadcast/axis attributes; its slope broadcasts to X (checked by the op).
binary_op("PRelu", "prelu", legacy_broadcast_until=0)

_FLOAT32_MAX = float(np.finfo(np.float32).max)


@importer("Clip", since=first_opset("Clip"))
def _clip(ctx: ImportCtx) -> Sequence[Value | None]:
    x = input_value(ctx, 0)
    if ctx.opset >= 11:
        return [ctx.emit1("clip", [x, ctx.input(1), ctx.input(2)], modern_attrs(ctx))]
    if ctx.num_inputs != 1:
        raise ctx.fail(f"takes 1 input before opset 11, got {ctx.num_inputs}")
    # opset 6 defaults to the float32 range; opset 1 leaves an absent bound unlimited
    defaults = (None, None) if ctx.opset < 6 else (-_FLOAT32_MAX, _FLOAT32_MAX)
    bounds: list[Value | None] = []
    for name, default in zip(("min", "max"), defaults):
        value = ctx.attr(name, default)
        if value is None:
            bounds.append(None)
            continue
        with np.errstate(over="ignore"):  # float16 rounds the float32 range's ends to +-inf, as a kernel would
            bounds.append(ctx.constant(np.asarray(value, dtype=x.type.dtype.np)))
    attrs = modern_attrs(ctx, drop=("min", "max"))
    return [ctx.emit1("clip", [x, *bounds], attrs)]


def _swish(ctx: ImportCtx, x: Value) -> Value:
    """``x * sigmoid(alpha * x)``, as ONNX's function body for Swish writes it."""
    alpha = ctx.constant(np.asarray(ctx.attr("alpha", 1.0), dtype=x.type.dtype.np))
    return ctx.emit1("mul", [x, ctx.emit1("sigmoid", [ctx.emit1("mul", [alpha, x])])])


@importer("Swish", since=first_opset("Swish"))
def _swish_importer(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("alpha",))
    return [_swish(ctx, input_value(ctx, 0))]


@importer("SwiGLU", since=first_opset("SwiGLU"))
def _swiglu(ctx: ImportCtx) -> Sequence[Value | None]:
    """``Swish_alpha(A) * B``; A and B have one shape (the op does not broadcast)."""
    known_attrs(ctx, ("alpha",))
    a, b = input_value(ctx, 0), input_value(ctx, 1)
    if a.type.rank != b.type.rank or any(
            isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(a.type.shape, b.type.shape)):
        raise ctx.fail(f"A {a.type} and B {b.type} must have the same shape (SwiGLU does not broadcast)")
    return [ctx.emit1("mul", [_swish(ctx, a), b])]

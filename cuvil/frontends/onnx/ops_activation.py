"""Importers of ONNX activation functions and Clip.

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

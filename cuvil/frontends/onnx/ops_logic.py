"""Importers of ONNX comparisons, logical and bitwise ops, BitShift, IsNaN/IsInf and Where.

Comparisons and And/Or/Xor before opset 7 used the legacy ``broadcast``/``axis``
attributes; ``binary_op`` upgrades them.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_elementwise import binary_op, first_opset, input_value, unary_op
from cuvil.ir.graph import Value

for _onnx, _cuvil in {
    "Equal": "equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_or_equal",
    "Less": "less",
    "LessOrEqual": "less_or_equal",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
    "BitShift": "bit_shift",
}.items():
    binary_op(_onnx, _cuvil)

for _onnx, _cuvil in {"Not": "not", "BitwiseNot": "bitwise_not", "IsNaN": "is_nan", "IsInf": "is_inf"}.items():
    unary_op(_onnx, _cuvil)


@importer("Where", since=first_opset("Where"))
def _where(ctx: ImportCtx) -> Sequence[Value | None]:
    if ctx.num_inputs != 3:
        raise ctx.fail(f"takes 3 inputs, got {ctx.num_inputs}")
    return [ctx.emit1("where", [input_value(ctx, i) for i in range(3)], dict(ctx.attrs))]

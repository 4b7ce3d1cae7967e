"""Importers of ONNX's window generators: HannWindow, HammingWindow, BlackmanWindow.

Each is the generalised cosine window ``a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)`` over
``n = 0 .. size - 1``, with ``N = size`` (periodic) or ``size - 1`` (symmetric), computed in float32 as
ONNX's function bodies for them compute it and cast to ``output_datatype``.  ``size`` may be a run-time
scalar: the window's length is then a run-time extent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

# (a0, a1, a2) as the function bodies write them (float32 constants)
_COEFFICIENTS = {
    "HannWindow": (0.5, 0.5, 0.0),
    "HammingWindow": (0.54347825, 0.45652175, 0.0),
    "BlackmanWindow": (0.42, 0.5, 0.08),
}
_TAU = 6.2831855


def _window_importer(op_type: str, coefficients: tuple[float, float, float]) -> None:
    @importer(op_type, since=17)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        known_attrs(ctx, ("periodic", "output_datatype"))
        size = ctx.input(0)
        if size is None:
            raise ctx.fail("needs its input size")
        if size.type.rank != 0 or size.type.dtype not in (DType.i32, DType.i64):
            raise ctx.fail(f"size must be an int32 or int64 scalar, got {size.type}")
        out_dtype = dtype_of(int(ctx.attr("output_datatype", 1)), f"{op_type} output_datatype")

        def f32(v: float) -> Value:
            return ctx.constant(np.float32(v))

        length = ctx.emit1("cast", [size], {"to": DType.f32})
        period = length if int(ctx.attr("periodic", 1)) else ctx.emit1("sub", [length, f32(1.0)])
        step = ctx.emit1("div", [f32(_TAU), period])
        angle = ctx.emit1("mul", [ctx.emit1("range", [f32(0.0), length, f32(1.0)]), step])
        a0, a1, a2 = coefficients
        y = ctx.emit1("sub", [f32(a0), ctx.emit1("mul", [f32(a1), ctx.emit1("cos", [angle])])])
        if a2:
            double = ctx.emit1("cos", [ctx.emit1("mul", [angle, f32(2.0)])])
            y = ctx.emit1("add", [y, ctx.emit1("mul", [f32(a2), double])])
        return ctx.emit("cast", [y], {"to": out_dtype})


for _op, _coefficients in _COEFFICIENTS.items():
    _window_importer(_op, _coefficients)

"""Importers of ONNX MatMul, Gemm, Einsum and Det.

Gemm before opset 7 has a ``broadcast`` attribute: with ``broadcast=0`` C must
already be ``[M, N]`` (checked here); with 1 it broadcasts as in later opsets.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.graph import Value


@importer("MatMul")
def _matmul(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    return ctx.emit("matmul", ctx.inputs())


@importer("Gemm")
def _gemm(ctx: ImportCtx) -> Sequence[Value | None]:
    names = ("alpha", "beta", "transA", "transB")
    known_attrs(ctx, (*names, "broadcast") if ctx.opset < 7 else names)
    attrs = {n: ctx.attrs[n] for n in names if n in ctx.attrs}
    (y,) = ctx.emit("gemm", ctx.inputs(), attrs)
    c = ctx.input(2)
    if ctx.opset < 7 and not ctx.attr("broadcast", 0) and c is not None and c.type.shape != y.type.shape:
        raise ctx.fail(f"with broadcast=0, C must have the output shape {y.type}, got {c.type}")
    return [y]


@importer("Einsum")
def _einsum(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("equation",))
    if "equation" not in ctx.attrs:
        raise ctx.fail("attribute 'equation' is required")
    return ctx.emit("einsum", ctx.inputs(), {"equation": ctx.attrs["equation"]})


@importer("Det")
def _det(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ())
    return ctx.emit("det", ctx.inputs())

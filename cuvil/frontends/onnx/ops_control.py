"""Importers of ONNX If and Loop as structured regions."""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import UNKNOWN
from cuvil.ir.types import TensorType


@importer("If")
def _if(ctx: ImportCtx) -> Sequence[Value | None]:
    then_g = ctx.subgraph("then_branch")
    else_g = ctx.subgraph("else_branch")
    n = len(ctx.node.output)
    return ctx.emit("if", [ctx.input(0)], {"then_branch": then_g, "else_branch": else_g}, num_outputs=n)


@importer("Loop")
def _loop(ctx: ImportCtx) -> Sequence[Value | None]:
    inputs = ctx.inputs()
    while len(inputs) < 2:
        inputs.append(None)
    carried = inputs[2:]
    if any(v is None for v in carried):
        raise ctx.fail("loop-carried inputs cannot be omitted")
    body_proto = ctx.attrs.get("body")
    declared = list(body_proto.input) if body_proto is not None else []
    types = [TensorType(DType.i64, ()), TensorType(DType.bool, ())]
    for k, v in enumerate(carried):
        assert v is not None
        t = v.type
        vi = declared[2 + k] if 2 + k < len(declared) else None
        static = None
        if vi is not None and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            if len(dims) == t.rank and all(d.WhichOneof("value") == "dim_value" for d in dims):
                static = tuple(int(d.dim_value) for d in dims)
        # A carried value may change shape between iterations: only a shape the
        # body itself declares statically is trusted inside it.
        types.append(TensorType(t.dtype, static if static is not None else tuple(UNKNOWN for _ in t.shape)))
    body = ctx.subgraph("body", types)
    n = len(ctx.node.output)
    return ctx.emit("loop", inputs, {"body": body}, num_outputs=n)

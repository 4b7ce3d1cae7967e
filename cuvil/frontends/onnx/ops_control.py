"""Importers of ONNX If and Loop as structured regions (an If that import decides: its branch, inlined).

A value that crosses into a region takes the type the region declares for it
only where the two agree: a Loop's carried value and its body's declared input
are unified here (a static size the body declares is kept, and the generated
code checks it on every iteration), and refused when they disagree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import onnx

from cuvil.errors import ModelError
from cuvil.frontends.onnx.conditions import condition_symbols, truth
from cuvil.frontends.onnx.dims import declared_dim
from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ir.symbolic import UNKNOWN, Dim
from cuvil.ir.types import TensorType

_log = logging.getLogger(__name__)


@importer("If")
def _if(ctx: ImportCtx) -> Sequence[Value | None]:
    """An If whose condition import can decide (cuvil/frontends/onnx/conditions.py) is the branch it
    takes, inlined: the other branch is never converted, so what it would compute (another rank, an
    op that fails for these types) cannot matter.  Otherwise both become regions of an ``if`` node."""
    cond = ctx.input(0)
    if cond is None:
        raise ctx.fail("needs a condition input")
    n = len(ctx.node.output)
    taken = truth(cond, ctx.symbols)
    if taken is not None:
        outs = ctx.inline("then_branch" if taken else "else_branch")
        if len(outs) != n:
            raise ctx.fail(f"has {n} outputs, but the branch it takes returns {len(outs)}")
        _log.debug("onnx If %r: the condition is always %s; the %s branch is inlined", ctx.name, taken,
                   "then" if taken else "else")
        return outs
    then_g = ctx.subgraph("then_branch")
    else_g = ctx.subgraph("else_branch")
    try:
        return ctx.emit("if", [cond], {"then_branch": then_g, "else_branch": else_g}, num_outputs=n)
    except ModelError as exc:
        names = sorted(condition_symbols(cond))
        if not names:
            raise
        hint = (f" (the condition depends on {', '.join(names)}: constraints that decide it, given with dims=, "
                "let the If fold at compile time)")
        raise ModelError(f"{exc}{hint}") from None


def _declared(vi: onnx.ValueInfoProto, what: str) -> tuple[DType | None, tuple[Dim, ...] | None]:
    """What a region declares for one of its inputs: element type and dims (``None``: not declared).

    Symbolic dims come back as symbols for display only; they are not facts about the value."""
    if vi.type.WhichOneof("value") != "tensor_type":
        return None, None
    tt = vi.type.tensor_type
    dtype = dtype_of(tt.elem_type, what) if tt.elem_type else None
    if not tt.HasField("shape"):
        return dtype, None
    # an unknown extent (-1, 0, an empty dim_param: cuvil/frontends/onnx/dims.py) declares nothing
    dims = [UNKNOWN if d is None else d for d in (declared_dim(d) for d in tt.shape.dim)]
    return dtype, tuple(dims)


def _describe(dtype: DType | None, dims: tuple[Dim, ...] | None) -> str:
    if dims is None:
        return f"{dtype or '?'} (shape not declared)"
    if dtype is None:
        return f"?[{', '.join(str(d) for d in dims)}]"
    return str(TensorType(dtype, dims))


def _carried_type(ctx: ImportCtx, k: int, init: Value, vi: onnx.ValueInfoProto | None) -> TensorType:
    """The type the body sees for carried value ``k``: the initial value's, unified with the body's declaration.

    A carried value may change shape between iterations, so a dim is trusted inside the
    body only where the body declares it statically; the C checks that dim on every
    iteration.  A static dim of the initial value that the body contradicts, another rank or
    another element type is refused here."""
    t = init.type
    if vi is None:
        return TensorType(t.dtype, tuple(UNKNOWN for _ in t.shape))
    dtype, dims = _declared(vi, f"body input {vi.name!r}")

    def refuse() -> Exception:
        return ctx.fail(f"carried value {k} ({init.name!r}) is {t}, but the body declares its input "
                        f"{vi.name!r} as {_describe(dtype, dims)}")

    if dtype is not None and dtype is not t.dtype:
        raise refuse()
    if dims is None:
        return TensorType(t.dtype, tuple(UNKNOWN for _ in t.shape))
    if len(dims) != t.rank:
        raise refuse()
    out: list[Dim] = []
    for d, s in zip(dims, t.shape):
        if isinstance(d, int):
            if isinstance(s, int) and s != d:
                raise refuse()
            out.append(d)
        else:
            out.append(UNKNOWN)
    return TensorType(t.dtype, tuple(out))


def _check_counter(ctx: ImportCtx, vi: onnx.ValueInfoProto | None, dtype: DType, what: str) -> None:
    """The body's iteration number and condition inputs are i64 and bool; another declared element type is refused."""
    if vi is None:
        return
    declared, _ = _declared(vi, f"body input {vi.name!r}")
    if declared is not None and declared is not dtype:
        raise ctx.fail(f"the body declares its {what} input {vi.name!r} as {declared}, but Loop passes {dtype}")


@importer("Loop")
def _loop(ctx: ImportCtx) -> Sequence[Value | None]:
    inputs = ctx.inputs()
    while len(inputs) < 2:
        inputs.append(None)
    carried = inputs[2:]
    if any(v is None for v in carried):
        raise ctx.fail("loop-carried inputs cannot be omitted")
    body_proto = ctx.attrs.get("body")
    if not isinstance(body_proto, onnx.GraphProto):
        raise ctx.fail("needs a graph attribute 'body'")
    declared = list(body_proto.input)
    _check_counter(ctx, declared[0] if declared else None, DType.i64, "iteration number")
    _check_counter(ctx, declared[1] if len(declared) > 1 else None, DType.bool, "condition")
    types = [TensorType(DType.i64, ()), TensorType(DType.bool, ())]
    for k, v in enumerate(carried):
        assert v is not None
        types.append(_carried_type(ctx, k, v, declared[2 + k] if 2 + k < len(declared) else None))
    body = ctx.subgraph("body", types)
    n = len(ctx.node.output)
    return ctx.emit("loop", inputs, {"body": body}, num_outputs=n)

"""Helpers shared by op declarations: broadcasting, axes, node inference, and the run-time checks a
graph needs (:func:`graph_assumptions`, derived by re-running inference; cuvil/ir/assumptions.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from cuvil.errors import ShapeError, StorageTypeError
from cuvil.ir.assumptions import BROADCAST, Assumption
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import Dim, broadcast_dim, format_dim
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ops.registry import STORAGE_TYPES, InferCtx, OpDef, get


def broadcast_shapes(op: str, *shapes: Sequence[Dim], ctx: InferCtx | None = None) -> tuple[Dim, ...]:
    """NumPy-style multidirectional broadcasting of shapes.

    With ``ctx``, each pair of dims that only run time can show to broadcast is
    recorded on it (``ctx.assume_broadcast``), and a pair the symbols' constraints
    rule out is an error; callers inferring a node's type always pass it."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = [1] * rank
    for s in shapes:
        padded = [1] * (rank - len(s)) + list(s)
        for i, d in enumerate(padded):
            try:
                merged = broadcast_dim(out[i], d)
            except ValueError:
                shown = " and ".join(f"[{', '.join(map(str, x))}]" for x in shapes)
                raise ShapeError(f"{op}: shapes {shown} do not broadcast") from None
            if ctx is not None:
                ctx.assume_broadcast(out[i], d, f"the operands' dims at output axis {i}")
            out[i] = merged
    return tuple(out)


def normalize_axis(op: str, axis: int, rank: int) -> int:
    """An axis in ``[-rank, rank)`` as a non-negative index."""
    if not -rank <= axis < rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def normalize_axes(op: str, axes: Sequence[int], rank: int) -> list[int]:
    out = [normalize_axis(op, int(a), rank) for a in axes]
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {list(axes)}")
    return out


def const_of(v: Value | None) -> np.ndarray | None:
    """The compile-time value of ``v`` when a ``constant`` node defines it."""
    if v is not None and v.producer is not None and v.producer.op == "constant":
        value: np.ndarray = v.producer.attrs["value"]
        return value
    return None


def infer_types(
    op: str,
    inputs: Sequence[Value | None],
    attrs: Mapping[str, object],
    num_outputs: int,
    symbols: Mapping[str, SymbolInfo] | None = None,
    *,
    record: list[Assumption] | None = None,
) -> tuple[list[TensorType], dict[str, object]]:
    """Run an op's inference; returns output types and the attributes with defaults.

    ``record`` receives the shape relations the node needs checked at run time (cuvil/ir/assumptions.py)."""
    types, full, _ = infer_all(op, inputs, attrs, num_outputs, symbols, record=record)
    return types, full


def infer_all(
    op: str,
    inputs: Sequence[Value | None],
    attrs: Mapping[str, object],
    num_outputs: int,
    symbols: Mapping[str, SymbolInfo] | None = None,
    *,
    record: list[Assumption] | None = None,
) -> tuple[list[TensorType], dict[str, object], list[tuple[Dim, ...] | None]]:
    """Inference with the outputs' symbolic contents (for ops that compute sizes)."""
    opdef = get(op)
    lo, hi = opdef.input_arity()
    n_in = len(inputs)
    while n_in and inputs[n_in - 1] is None:
        n_in -= 1
    if n_in < lo or (hi is not None and n_in > hi):
        want = f"{lo}" if hi == lo else f"{lo} to {hi if hi is not None else 'any'}"
        raise ShapeError(f"{op}: takes {want} inputs, got {n_in}")
    for i, name in enumerate(opdef.inputs):
        if not name.endswith(("?", "*")) and (i >= len(inputs) or inputs[i] is None):
            raise ShapeError(f"{op}: required input {i} ({name}) is missing")
    olo, ohi = opdef.output_arity()
    if num_outputs < min(olo, 1) or (ohi is not None and num_outputs > ohi):
        raise ShapeError(f"{op}: cannot produce {num_outputs} outputs")
    _refuse_storage_types(opdef, [v.type if v is not None else None for v in inputs], "input")
    full = opdef.fill_attrs(attrs)
    ctx = InferCtx(
        op=op,
        types=[v.type if v is not None else None for v in inputs],
        consts=[const_of(v) for v in inputs],
        attrs=full,
        num_outputs=num_outputs,
        symbols=symbols or {},
        sym_values=[v.sym_value if v is not None else None for v in inputs],
    )
    types = list(opdef.infer(ctx))
    _refuse_storage_types(opdef, types[:num_outputs], "output")
    if len(types) < num_outputs:
        raise ShapeError(f"{op}: inference gave {len(types)} outputs, {num_outputs} requested")
    if record is not None:
        record.extend(ctx.assumptions)
    syms: list[tuple[Dim, ...] | None] = [None] * num_outputs
    if opdef.sym_eval is not None:
        got = list(opdef.sym_eval(ctx))[:num_outputs]
        syms[: len(got)] = got
    return types[:num_outputs], full, syms


def _refuse_storage_types(opdef: OpDef, types: Sequence[TensorType | None], what: str) -> None:
    """A low-bit storage type reaches only the ops that take them (``STORAGE_TYPES``)."""
    if STORAGE_TYPES in opdef.traits:
        return
    for i, t in enumerate(types):
        if t is not None and t.dtype.is_lowbit:
            raise StorageTypeError(
                f"{opdef.name}: {what} {i} has element type {t.dtype}, a low-bit storage type; only "
                f"quantize_linear, dequantize_linear, cast and data movement take it (cast or dequantize it first)")


def graph_assumptions(graph: Graph) -> list[Assumption]:
    """The run-time checks ``graph`` needs, in node order, each relation once (the first node
    needing it is named).  Re-runs inference on every node, regions included."""
    seen: set[tuple[str, str, str]] = set()
    out: list[Assumption] = []
    for n in graph.walk():
        found: list[Assumption] = []
        infer_types(n.op, n.inputs, n.attrs, len(n.outputs), graph.symbols, record=found)
        for a in found:
            lhs, rhs = format_dim(a.lhs), format_dim(a.rhs)
            if a.kind == BROADCAST and rhs < lhs:  # symmetric
                lhs, rhs = rhs, lhs
            key = (a.kind, lhs, rhs)
            if key in seen:
                continue
            seen.add(key)
            out.append(Assumption(a.kind, a.lhs, a.rhs, a.what, n.op, n.name))
    return out


def infer_node(node: Node, symbols: Mapping[str, SymbolInfo] | None = None) -> list[TensorType]:
    return infer_types(node.op, node.inputs, node.attrs, len(node.outputs), symbols)[0]


def symbolic_ints(ctx: InferCtx, i: int, what: str) -> list[Dim] | None:
    """The contents of integer input ``i`` as dims: constants, or sizes derived from shapes."""
    if ctx.const(i) is not None:
        return list(static_ints(ctx, i, what) or [])
    sv = ctx.sym_value(i)
    return list(sv) if sv is not None else None


def static_ints(ctx: InferCtx, i: int, what: str) -> list[int] | None:
    """The integer contents of constant input ``i``, or None when computed at run time."""
    c = ctx.const(i)
    if c is None:
        return None
    if c.dtype.kind not in "iu":
        raise ctx.fail(f"{what} must be integers, got {c.dtype}")
    return [int(x) for x in c.reshape(-1)]


def same_type(t: TensorType, dtype: DType | None = None) -> TensorType:
    return TensorType(dtype or t.dtype, t.shape)

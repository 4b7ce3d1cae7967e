"""A float64 copy of a float32 graph, for a higher-precision reference."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType


def _widen_type(t: TensorType) -> TensorType:
    return TensorType(DType.f64, t.shape) if t.dtype is DType.f32 else t


def _widen_attr(a: Any, mapping: Mapping[Value, Value], root: Graph) -> Any:
    if isinstance(a, Graph):
        return _convert(a, mapping, root)
    if isinstance(a, np.ndarray) and a.dtype == np.float32:
        return a.astype(np.float64)
    if isinstance(a, DType) and a is DType.f32:
        return DType.f64
    return a


def _convert(g: Graph, outer: Mapping[Value, Value], root: Graph) -> Graph:
    from cuvil.ops.common import infer_all

    new = Graph(name=g.name)
    new.symbols = root.symbols
    m: dict[Value, Value] = dict(outer)
    for v in g.inputs:
        nv = Value(v.name, _widen_type(v.type))
        new.inputs.append(nv)
        m[v] = nv
    for n in g.nodes:
        attrs = {k: _widen_attr(a, m, root) for k, a in n.attrs.items()}
        ins = [m[v] if v is not None else None for v in n.inputs]
        types, full, syms = infer_all(n.op, ins, attrs, len(n.outputs), root.symbols)
        outs = [Value(o.name, t) for o, t in zip(n.outputs, types)]
        for o, sv in zip(outs, syms):
            o.sym_value = sv
        new.nodes.append(Node(n.op, ins, outs, full, n.name))
        m.update(zip(n.outputs, outs))
    new.outputs = [m[v] for v in g.outputs]
    return new


def widen_graph(graph: Graph) -> Graph:
    """A copy of ``graph`` computing every float32 value in float64 (types re-inferred)."""
    return _convert(graph, {}, graph)

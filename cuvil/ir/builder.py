"""Building graphs node by node with types inferred from the op registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import infer_all


class Builder:
    """Appends nodes to a graph; each node's output types come from its op's inference."""

    def __init__(self, graph: Graph | None = None, symbols_from: Graph | None = None) -> None:
        self.graph = graph if graph is not None else Graph()
        self._symbols_from = symbols_from or self.graph
        self._count = 0

    def nested(self, graph: Graph) -> Builder:
        """A builder for ``graph``, a region of this builder's graph: its nodes are typed with the
        symbols of the graph this builder takes them from."""
        return Builder(graph, symbols_from=self._symbols_from)

    def fresh_name(self, hint: str = "t") -> str:
        self._count += 1
        return f"{hint}{self._count}"

    def input(self, name: str, type: TensorType) -> Value:
        v = Value(name, type)
        self.graph.inputs.append(v)
        return v

    def add(
        self,
        op: str,
        inputs: Sequence[Value | None],
        attrs: Mapping[str, Any] | None = None,
        *,
        num_outputs: int = 1,
        names: Sequence[str] | None = None,
        node_name: str = "",
    ) -> list[Value]:
        types, full, syms = infer_all(op, inputs, attrs or {}, num_outputs, self._symbols_from.symbols)
        if names is None:
            names = [self.fresh_name() for _ in types]
        outs = [Value(n, t) for n, t in zip(names, types)]
        for o, sv in zip(outs, syms):
            o.sym_value = sv
        self.graph.nodes.append(Node(op, list(inputs), outs, full, node_name))
        return outs

    def add1(self, op: str, inputs: Sequence[Value | None], attrs: Mapping[str, Any] | None = None, **kw: Any) -> Value:
        return self.add(op, inputs, attrs, **kw)[0]

    def constant(self, value: np.ndarray | float | int | Sequence[Any], dtype: DType | None = None, name: str | None = None) -> Value:
        arr = np.asarray(value, dtype=dtype.np if dtype else None)
        if dtype is None and arr.dtype == np.float64 and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)
        return self.add1("constant", [], {"value": arr}, names=[name or self.fresh_name("c")])

    def output(self, *values: Value) -> None:
        self.graph.outputs.extend(values)

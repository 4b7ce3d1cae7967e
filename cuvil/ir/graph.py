"""The Cuvil IR: values, nodes and graphs (a typed SSA tensor graph).

A :class:`Graph` holds its inputs, an ordered list of :class:`Node` and its
outputs.  Every :class:`Value` is defined once: by a graph input or by one
node output.  Nodes name an op of the registry (``cuvil.ops``) and carry
attributes; control-flow nodes carry nested graphs (regions) as attributes,
and a region may read values of the graphs around it.  Weights are the
outputs of ``constant`` nodes, whose ``value`` attribute is a NumPy array.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from cuvil.ir.symbolic import Dim
from cuvil.ir.types import SymbolInfo, TensorType

_ids = itertools.count()


class Value:
    """An SSA value: a tensor with a type, defined once."""

    __slots__ = ("name", "producer", "sym_value", "type", "uid")

    def __init__(self, name: str, type: TensorType, producer: Node | None = None) -> None:
        self.name = name
        self.type = type
        self.producer = producer
        self.uid = next(_ids)
        # For a small integer tensor holding sizes (what shape() gives), its contents as dims,
        # when inference can tell: derived from the producer, never set by hand.
        self.sym_value: tuple[Dim, ...] | None = None

    def __repr__(self) -> str:
        return f"Value({self.name!r}: {self.type})"


class Node:
    """One operation: an op name, inputs (``None`` for an omitted optional
    input), attributes and output values."""

    __slots__ = ("attrs", "inputs", "name", "op", "outputs")

    def __init__(
        self,
        op: str,
        inputs: list[Value | None],
        outputs: list[Value],
        attrs: Mapping[str, Any] | None = None,
        name: str = "",
    ) -> None:
        self.op = op
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.name = name
        for o in self.outputs:
            o.producer = self

    def regions(self) -> Iterator[tuple[str, Graph]]:
        """The nested graphs of this node, in attribute order."""
        for k, v in self.attrs.items():
            if isinstance(v, Graph):
                yield k, v

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.name!r})"


class Graph:
    """A function from input tensors to output tensors."""

    def __init__(
        self,
        inputs: list[Value] | None = None,
        nodes: list[Node] | None = None,
        outputs: list[Value] | None = None,
        name: str = "main",
        symbols: Mapping[str, SymbolInfo] | None = None,
    ) -> None:
        self.inputs: list[Value] = list(inputs or [])
        self.nodes: list[Node] = list(nodes or [])
        self.outputs: list[Value] = list(outputs or [])
        self.name = name
        self.symbols: dict[str, SymbolInfo] = dict(symbols or {})
        # Where each intermediate of the top-level schedule lives in the call's arena: a
        # cuvil.backends.c.memplan.MemoryPlan, set by the plan-memory pass and read by the C code
        # generator (the IR never looks inside it). None: every tensor is allocated on its own.
        self.memory_plan: Any = None

    def walk(self) -> Iterator[Node]:
        """Every node, nested regions included, in order."""
        for n in self.nodes:
            yield n
            for _, g in n.regions():
                yield from g.walk()

    def share_symbols(self) -> None:
        """Make every region use this graph's symbol table (symbols are model-wide)."""
        for n in self.walk():
            for _, g in n.regions():
                g.symbols = self.symbols

    def constants(self) -> dict[Value, np.ndarray]:
        return {n.outputs[0]: n.attrs["value"] for n in self.nodes if n.op == "constant"}

    def users(self) -> dict[Value, list[Node]]:
        """The nodes (of this graph, counting uses inside their regions) reading each value."""
        out: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in reads(n):
                out.setdefault(v, []).append(n)
        return out

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"


def captures(node: Node) -> set[Value]:
    """The values of enclosing graphs that ``node``'s regions read (at any depth)."""
    out: set[Value] = set()
    for _, region in node.regions():
        defined = set(region.inputs)
        inner: set[Value] = set(region.outputs)
        for n in region.nodes:
            defined.update(n.outputs)
            inner |= reads(n)
        out |= inner - defined
    return out


def reads(node: Node) -> set[Value]:
    """The values ``node`` reads: its inputs, and what its regions read from outside themselves."""
    return {v for v in node.inputs if v is not None} | captures(node)

"""Candidates: the original graph cut down to a set of its top-level nodes.

A :class:`Cut` names the kept nodes (by position in the original graph) and the outputs.  What the
kept nodes read and no kept node defines is fed its value *recorded* in the original run (never a
random stand-in): as a new graph input (its type kept, symbolic dims and all: the symbols stay
symbolic) or, where the cut asks for it and the type is static, as a constant.  Integer and bool
tensors are always constants: they are sizes, indices and masks, which shape inference needs to see.
The original's constants are kept wherever a kept node reads them and never count in the size.
Control-flow nodes are kept or cut whole, their regions with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.ir.graph import Graph, Node, Value, reads
from cuvil.ir.printer import print_graph


@dataclass(frozen=True)
class Cut:
    """Kept node positions, the outputs, and the cut values fed as constants rather than inputs."""

    keep: frozenset[int]
    outputs: tuple[Value, ...]
    as_constants: frozenset[Value] = frozenset()


def record(graph: Graph, inputs: Sequence[np.ndarray]) -> dict[Value, np.ndarray]:
    """Every top-level value of ``graph``'s reference run on ``inputs``."""
    env: dict[Value, np.ndarray] = dict(zip(graph.inputs, inputs))
    top = {id(n) for n in graph.nodes}

    def on_node(node: Node, outs: list[np.ndarray]) -> None:
        if id(node) in top:
            env.update(zip(node.outputs, outs))

    run_graph(graph, list(inputs), on_node=on_node)
    return env


class Space:
    """The original graph, its recorded values, and how cuts of it are built and printed."""

    def __init__(self, graph: Graph, recorded: dict[Value, np.ndarray]) -> None:
        self.graph = graph
        self.recorded = recorded
        self.producer: dict[Value, int] = {o: i for i, n in enumerate(graph.nodes) for o in n.outputs}
        #: positions of the nodes that count (every node but the constants)
        self.work = [i for i, n in enumerate(graph.nodes) if n.op != "constant"]

    def size(self, cut: Cut) -> int:
        return len(self.live(cut))

    def frontier(self, keep: frozenset[int]) -> tuple[Value, ...]:
        """The values the kept nodes define and no kept node reads, with the original outputs they define."""
        read: set[Value] = set()
        for i in keep:
            read |= reads(self.graph.nodes[i])
        outs = [o for i in sorted(keep) for o in self.graph.nodes[i].outputs
                if o not in read or o in self.graph.outputs]
        return tuple(dict.fromkeys(outs))

    def cut(self, keep: Sequence[int] | frozenset[int], outputs: Sequence[Value] | None = None,
            as_constants: bool = False) -> Cut:
        """The cut keeping ``keep``; outputs default to its frontier.  ``as_constants``: feed the cut
        values as constants (a side branch replaced by its values) rather than as inputs."""
        k = frozenset(keep)
        outs = tuple(outputs) if outputs is not None else self.frontier(k)
        outs = tuple(o for o in outs if self.producer.get(o) in k) or self.frontier(k)
        consts: frozenset[Value] = frozenset()
        if as_constants:
            consts = frozenset(v for i in k for v in reads(self.graph.nodes[i]))
        return Cut(k, outs, consts)

    def live(self, cut: Cut) -> list[int]:
        """The kept non-constant nodes the outputs depend on, in order."""
        need = set(cut.outputs)
        live: list[int] = []
        for i in sorted(cut.keep, reverse=True):
            n = self.graph.nodes[i]
            if n.op != "constant" and any(o in need for o in n.outputs):
                live.append(i)
                need |= reads(n)
        return sorted(live)

    def build(self, cut: Cut) -> tuple[str, dict[str, np.ndarray]]:
        """The cut's text form and its inputs (by name)."""
        live = self.live(cut)
        kept = set(live)
        need: set[Value] = set(cut.outputs)
        for i in live:
            need |= reads(self.graph.nodes[i])
        defined = {o for i in live for o in self.graph.nodes[i].outputs}
        consts: list[Node] = []
        new_inputs: list[Value] = []
        made: list[Value] = []  # values whose producer the build points elsewhere, put back after printing
        original = {v: v.producer for v in need}
        try:
            for v in sorted(need - defined, key=self._order):
                p = self.producer.get(v)
                if p is not None and self.graph.nodes[p].op == "constant":
                    consts.append(self.graph.nodes[p])
                elif v in self.graph.inputs:
                    new_inputs.append(v)
                elif self._constant(v, cut):
                    made.append(v)
                    consts.append(Node("constant", [], [v], {"value": self.recorded[v]}, name=f"recorded_{v.name}"))
                else:
                    new_inputs.append(v)
            g = Graph(new_inputs, consts + [self.graph.nodes[i] for i in sorted(kept)], list(cut.outputs),
                      self.graph.name, dict(self.graph.symbols))
            text = print_graph(g)
        finally:
            for v in made:
                v.producer = original[v]
        return text, {v.name: self.recorded[v] for v in new_inputs}

    def expected(self, cut: Cut) -> dict[str, np.ndarray]:
        """The cut's outputs as the original run recorded them: the reference's outputs on the cut, known
        without running it again."""
        return {v.name: self.recorded[v] for v in cut.outputs}

    def _order(self, v: Value) -> tuple[int, str]:
        if v in self.graph.inputs:
            return (-1 - self.graph.inputs[::-1].index(v), v.name)
        return (self.producer.get(v, len(self.graph.nodes)), v.name)

    def _constant(self, v: Value, cut: Cut) -> bool:
        if not v.type.is_static:
            return False  # a symbolic type stays an input: the symbol is kept
        return v in cut.as_constants or not v.type.dtype.holds_floats

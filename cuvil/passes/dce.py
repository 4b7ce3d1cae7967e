"""Dead-code elimination: nodes whose results nothing reads are removed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cuvil.ir.graph import Graph, Node, Value, reads
from cuvil.passes.base import Pass, PassResult, register_pass


@register_pass
@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Removes nodes whose outputs nothing reads, in the graph and inside every region.

    1. A node is live when a graph output is one of its outputs, or a live node reads one of
       them (a node reads its inputs and every value of an enclosing graph its regions read).
    2. Inside a region the roots are the region's outputs; a region is cleaned before the
       values it reads from enclosing graphs are counted, so dead code in a region keeps
       nothing outside it alive.
    3. A node with any live output is kept whole (its other outputs included): the op's
       arity is part of its meaning.  Graph and region inputs are never removed.
    4. Cuvil's op set has no side effects, so no node is kept for its effects.
    """

    name: ClassVar[str] = "dce"

    def run(self, graph: Graph) -> PassResult:
        return PassResult(graph, _clean(graph) > 0)


def _clean(graph: Graph) -> int:
    """Remove the dead nodes of ``graph`` and its regions; the number removed.  Values read from
    enclosing graphs are not this graph's business: :func:`cuvil.ir.graph.reads` reports them to the caller."""
    live: set[Value] = set(graph.outputs)
    kept: list[Node] = []
    removed = 0
    for node in reversed(graph.nodes):
        if not any(o in live for o in node.outputs):
            removed += 1 + sum(1 for _, r in node.regions() for _ in r.walk())
            continue
        for _, region in node.regions():
            removed += _clean(region)
        live.update(reads(node))
        kept.append(node)
    kept.reverse()
    graph.nodes = kept
    return removed



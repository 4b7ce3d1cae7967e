"""The IR verifier: structural rules and types re-derived from the op registry.

Rules, checked over the graph and every region in it:

1. Every node names a registered op and has attributes that op accepts.
2. Every value is defined once (a graph input or one node output), and is
   defined before it is read; a region may read values of its enclosing
   graphs defined before the node that holds it.
3. Every node's output types equal what its op's inference gives.
4. Every graph output is defined, and every symbol used in a type is declared.
"""

from __future__ import annotations

from collections.abc import Iterable

from cuvil.errors import CuvilError, IRError
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import infer_all
from cuvil.ops.registry import lookup


def verification_errors(graph: Graph) -> list[str]:
    """Every rule the graph breaks, as sentences; empty when it is valid."""
    problems: list[str] = []
    defined: set[Value] = set()

    def where(n: Node) -> str:
        return f"node {n.name!r} ({n.op})" if n.name else f"node {n.op}"

    def check_types(types: Iterable[TensorType], what: str) -> None:
        for t in types:
            missing = t.symbols() - set(graph.symbols)
            if missing:
                problems.append(f"{what}: type {t} uses undeclared symbol(s) {', '.join(sorted(missing))}")

    def visit(g: Graph, visible: set[Value]) -> None:
        scope = set(visible)
        for v in g.inputs:
            if v in defined:
                problems.append(f"graph {g.name!r}: input {v.name!r} is defined twice")
            defined.add(v)
            scope.add(v)
        check_types((v.type for v in g.inputs), f"graph {g.name!r} inputs")
        for n in g.nodes:
            if lookup(n.op) is None:
                problems.append(f"{where(n)}: unknown op {n.op!r}")
                continue
            for i, arg in enumerate(n.inputs):
                if arg is not None and arg not in scope:
                    problems.append(f"{where(n)}: input {i} (%{arg.name}) is not defined before use")
            for _, region in n.regions():
                visit(region, scope)
            try:
                types, _, syms = infer_all(n.op, n.inputs, n.attrs, len(n.outputs), graph.symbols)
                for o, sv in zip(n.outputs, syms):  # derived state: re-derived here, never trusted
                    o.sym_value = sv
            except CuvilError as exc:
                problems.append(f"{where(n)}: {exc}")
                types = None
            except Exception as exc:  # an inference bug must not hide the other findings
                problems.append(f"{where(n)}: inference failed: {type(exc).__name__}: {exc}")
                types = None
            for k, o in enumerate(n.outputs):
                if o in defined:
                    problems.append(f"{where(n)}: output %{o.name} is defined twice")
                defined.add(o)
                scope.add(o)
                if o.producer is not n:
                    problems.append(f"{where(n)}: output %{o.name} does not point back to its node")
                if types is not None and k < len(types) and types[k] != o.type:
                    problems.append(f"{where(n)}: output %{o.name} has type {o.type}, its op infers {types[k]}")
            check_types((o.type for o in n.outputs), where(n))
        for v in g.outputs:
            if v not in scope:
                problems.append(f"graph {g.name!r}: output %{v.name} is not defined")

    visit(graph, set())
    return problems


def verify(graph: Graph) -> None:
    """Raise :class:`IRError` listing every rule the graph breaks."""
    problems = verification_errors(graph)
    if problems:
        shown = "\n  ".join(problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        raise IRError(f"invalid IR ({len(problems)} problems):\n  {shown}{more}")

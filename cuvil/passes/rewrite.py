"""Graph rewriting helpers shared by passes: replacing values, keeping the signature, copying graphs.

Passes rewrite a graph in place.  The one contract every rewrite must keep is
the graph's signature: its inputs, and its outputs' names and types.  A value
that is an output of its graph can therefore only be replaced by a value that
a node of that same graph defines, that is not already one of its outputs and
that has the same type; the replacement then takes the output's name.  The
same rule holds for the outputs of regions (backends rely on a region's
outputs being defined inside it, as the importer makes them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping

from cuvil.ir.graph import Graph, Node, Value

Substitution = MutableMapping[Value, Value]


def resolve(v: Value, subst: Mapping[Value, Value]) -> Value:
    """``v`` after every replacement recorded in ``subst`` (chains followed to their end)."""
    while v in subst:
        v = subst[v]
    return v


def resolve_inputs(node: Node, subst: Mapping[Value, Value]) -> bool:
    """Point ``node``'s inputs at their replacements; whether any changed."""
    changed = False
    for i, v in enumerate(node.inputs):
        if v is not None and v in subst:
            node.inputs[i] = resolve(v, subst)
            changed = True
    return changed


def resolve_outputs(region: Graph, subst: Mapping[Value, Value]) -> bool:
    """Point a region's outputs at their replacements; whether any changed.

    Only for regions, whose outputs may be values of the enclosing graphs (the verifier allows
    it): the outputs of the top graph change only through :func:`replace_value`, which keeps
    their names."""
    changed = False
    for i, v in enumerate(region.outputs):
        if v in subst:
            region.outputs[i] = resolve(v, subst)
            changed = True
    return changed


def defined_by_nodes(graph: Graph) -> set[Value]:
    """The values that nodes of ``graph`` itself (not of its regions) define."""
    return {o for n in graph.nodes for o in n.outputs}


def can_replace(graph: Graph, old: Value, new: Value, local: set[Value] | None = None) -> bool:
    """Whether ``old`` (defined in ``graph``) may be replaced by ``new`` everywhere.

    ``local`` is :func:`defined_by_nodes` of ``graph`` when the caller keeps it at hand."""
    if old is new:
        return False
    if old.type != new.type:
        return False
    if old not in graph.outputs:
        return True
    defined = local if local is not None else defined_by_nodes(graph)
    return new in defined and new not in graph.outputs


def replace_value(graph: Graph, old: Value, new: Value, subst: Substitution) -> None:
    """Record ``old -> new`` in ``subst``; if ``old`` is an output of ``graph``, ``new`` takes its
    place and its name.  Callers check :func:`can_replace` first."""
    subst[old] = new
    for i, v in enumerate(graph.outputs):
        if v is old:
            graph.outputs[i] = new
            new.name = old.name


def nodes_in_order(graph: Graph) -> Iterator[tuple[Graph, Node]]:
    """Each node with the graph that holds it, regions visited right after their node is."""
    for n in list(graph.nodes):
        yield graph, n
        for _, region in n.regions():
            yield from nodes_in_order(region)


def copy_graph(graph: Graph) -> Graph:
    """A copy that shares nothing mutable with ``graph`` (constant arrays, which are never
    written, are shared).  Symbols stay one table for the graph and its regions."""
    vmap: dict[Value, Value] = {}

    def value(v: Value) -> Value:
        if v not in vmap:  # a value read before its definition (invalid IR) is copied on first sight
            c = Value(v.name, v.type)
            c.sym_value = v.sym_value
            vmap[v] = c
        return vmap[v]

    def copy(g: Graph) -> Graph:
        out = Graph(name=g.name, symbols=g.symbols)
        out.inputs = [value(v) for v in g.inputs]
        for n in g.nodes:
            attrs = {k: copy(a) if isinstance(a, Graph) else list(a) if isinstance(a, list) else a
                     for k, a in n.attrs.items()}
            ins = [value(v) if v is not None else None for v in n.inputs]
            out.nodes.append(Node(n.op, ins, [value(o) for o in n.outputs], attrs, n.name))
        out.outputs = [value(v) for v in g.outputs]
        return out

    result = copy(graph)
    result.symbols = dict(graph.symbols)
    result.share_symbols()
    result.memory_plan = graph.memory_plan  # immutable, and keyed by node positions, which the copy keeps
    return result

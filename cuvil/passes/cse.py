"""Common-subexpression elimination: a node that repeats an earlier one is replaced by it."""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.passes.base import Pass, PassResult, register_pass
from cuvil.passes.rewrite import (
    Substitution,
    can_replace,
    defined_by_nodes,
    replace_value,
    resolve_inputs,
    resolve_outputs,
)

_SAMPLE = 64  # elements of a tensor attribute that go into a node's key


@register_pass
@dataclass(frozen=True)
class CommonSubexpressionElimination(Pass):
    """Merges nodes that compute the same thing, keeping the first.

    1. Two nodes are the same when they have the same op, the same inputs (the same values, in
       the same order) and equal attributes (tensors equal bit for bit, floats equal bit for bit,
       so ``0.0`` and ``-0.0`` differ).  ``constant`` nodes are compared by their tensor.
    2. A binary op with the commutative trait matches with its inputs either way round
       (``add(a, b)`` is ``add(b, a)``); variadic ops keep their order, since summing in
       another order rounds differently.
    3. Nodes with regions, and ops with the nondeterministic trait, are never merged.
    4. A node inside a region may be replaced by an equal node of an enclosing graph that comes
       before it (that value is visible there); nothing is hoisted out of a region, and regions
       of one node do not share nodes with each other.
    5. A graph (or region) output is only replaced by a value a node of the same graph defines
       and that is not already an output; the value then takes the output's name.
    """

    name: ClassVar[str] = "cse"

    def run(self, graph: Graph) -> PassResult:
        subst: Substitution = {}
        removed = _visit(graph, ChainMap(), subst)
        return PassResult(graph, removed > 0)


def _visit(graph: Graph, table: ChainMap[Hashable, list[Node]], subst: Substitution) -> int:
    from cuvil.ops.registry import COMMUTATIVE, NONDETERMINISTIC, lookup

    removed = 0
    local = defined_by_nodes(graph)
    kept: list[Node] = []
    for node in graph.nodes:
        resolve_inputs(node, subst)
        regions = list(node.regions())
        for _, region in regions:
            removed += _visit(region, table.new_child(), subst)
            resolve_outputs(region, subst)
        opdef = lookup(node.op)
        if regions or opdef is None or NONDETERMINISTIC in opdef.traits or not node.outputs:
            kept.append(node)
            continue
        key = _key(node, COMMUTATIVE in opdef.traits)
        candidates = table.get(key, [])
        earlier = next((e for e in candidates if _same_tensors(node, e)), None)
        if earlier is not None and all(can_replace(graph, o, e, local) for o, e in zip(node.outputs, earlier.outputs)):
            for o, e in zip(node.outputs, earlier.outputs):
                replace_value(graph, o, e, subst)
            removed += 1
            continue
        if earlier is None:
            table[key] = [*candidates, node]  # a new list: the enclosing scopes' lists stay theirs
        kept.append(node)
    graph.nodes = kept
    return removed


def _key(node: Node, commutative: bool) -> Hashable:
    ins: tuple[int | None, ...] = tuple(v.uid if v is not None else None for v in node.inputs)
    if commutative and len(ins) == 2 and None not in ins:
        ins = tuple(sorted(ins, key=lambda u: -1 if u is None else u))
    attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
    return (node.op, len(node.outputs), ins, attrs)


def _same_tensors(a: Node, b: Node) -> bool:
    """Whether the tensor attributes that :func:`_key` only sampled are equal byte for byte."""
    for k, x in a.attrs.items():
        y = b.attrs.get(k)
        if isinstance(x, np.ndarray) and not (isinstance(y, np.ndarray) and x.tobytes() == y.tobytes()):
            return False
    return True


def _attr_key(v: Any) -> Hashable:
    if isinstance(v, np.ndarray):
        # A sample, not a digest of every byte: hashing every weight of a large model costs more
        # than the pass itself.  Nodes whose keys match are compared in full (_same_tensors).
        flat = v.reshape(-1)
        picks = np.linspace(0, flat.size - 1, num=min(flat.size, _SAMPLE)).astype(np.int64)
        return ("tensor", v.dtype.str, v.shape, flat[picks].tobytes())
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, int | str | DType) or v is None:
        return (type(v).__name__, v)
    if isinstance(v, list | tuple):
        return ("list", tuple(_attr_key(x) for x in v))
    if isinstance(v, Value):
        return ("value", v.uid)
    raise TypeError(f"cse: cannot compare attribute value of type {type(v).__name__}")

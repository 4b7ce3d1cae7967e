"""Elementwise fusion: GELU written out by exporters becomes the ``gelu`` op, and chains of
elementwise ops become one ``fused_elementwise`` node (one loop in generated code).

Also the helpers the epilogue fusion (``fuse_epilogue.py``) shares: which nodes may join a
fused region, how many times each value is read, and how a group of nodes becomes a closed
region.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from cuvil.ir.dtypes import DType, is_float_np
from cuvil.ir.graph import Graph, Node, Value, captures
from cuvil.ops.common import const_of
from cuvil.ops.fused import FUSABLE_DTYPES
from cuvil.ops.registry import ELEMENTWISE, lookup
from cuvil.passes.base import GraphPass, nested_graphs, register_pass

# Helpers shared with fuse_epilogue.py ----------------------------------------------------------


def fusable(node: Node) -> bool:
    """Whether ``node`` may join a fused region (the rules of ``cuvil/ops/fused.py``)."""
    opdef = lookup(node.op)
    if opdef is None or ELEMENTWISE not in opdef.traits or len(node.outputs) != 1:
        return False
    if any(True for _ in node.regions()):
        return False
    return all(v.type.dtype in FUSABLE_DTYPES for v in [*node.inputs, *node.outputs] if v is not None)


def use_counts(graph: Graph) -> dict[Value, int]:
    """How many times each value is read: per operand slot, per node whose regions read it, per graph output."""
    counts: dict[Value, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None:
                counts[v] = counts.get(v, 0) + 1
        for v in captures(n):
            counts[v] = counts.get(v, 0) + 1
    for v in graph.outputs:
        counts[v] = counts.get(v, 0) + 1
    return counts


def build_region(name: str, graph: Graph, nodes: Sequence[Node], result: Value,
                 seeds: Sequence[Value] = ()) -> tuple[Graph, list[Value]]:
    """A closed region computing ``result`` with copies of ``nodes`` (in graph order).

    The region's inputs are ``seeds`` then every other value the nodes read, in order of first
    reading; returns the region and those other values (the fused node's extra operands)."""
    region = Graph(name=name, symbols=graph.symbols)
    mapping: dict[Value, Value] = {}
    for i, seed in enumerate(seeds):
        mapping[seed] = Value("acc" if i == 0 and len(seeds) == 1 else f"seed{i}", seed.type)
        region.inputs.append(mapping[seed])
    externals: list[Value] = []
    for n in nodes:
        ins: list[Value | None] = []
        for v in n.inputs:
            if v is None:
                ins.append(None)
                continue
            if v not in mapping:
                mapping[v] = Value(f"in{len(externals)}", v.type)
                mapping[v].sym_value = v.sym_value
                region.inputs.append(mapping[v])
                externals.append(v)
            ins.append(mapping[v])
        outs = []
        for o in n.outputs:
            mapping[o] = Value(o.name, o.type)
            mapping[o].sym_value = o.sym_value
            outs.append(mapping[o])
        region.nodes.append(Node(n.op, ins, outs, n.attrs, n.name))
    region.outputs = [mapping[result]]
    return region, externals


def rebuild(graph: Graph, replaced: dict[Node, list[Node]], removed: set[Node]) -> None:
    """Rewrite ``graph.nodes``: each key of ``replaced`` becomes its nodes, ``removed`` ones go."""
    out: list[Node] = []
    for n in graph.nodes:
        if n in replaced:
            out.extend(replaced[n])
        elif n not in removed:
            out.append(n)
    graph.nodes = out


def drop_unused_constants(graph: Graph, candidates: Iterable[Value]) -> None:
    """Remove the ``constant`` nodes among ``candidates``' producers that nothing reads any more."""
    counts = use_counts(graph)
    dead = {v.producer for v in candidates
            if v.producer is not None and v.producer.op == "constant" and counts.get(v, 0) == 0}
    if dead:
        graph.nodes = [n for n in graph.nodes if n not in dead]


def scalar_const(v: Value | None) -> float | None:
    """The value of a one-element float constant, else None."""
    c = const_of(v)
    if c is None or c.size != 1 or not is_float_np(c.dtype):
        return None
    return float(c.reshape(()))


# recognize-gelu --------------------------------------------------------------------------------

_SQRT2 = math.sqrt(2.0)
_GELU_DTYPES = frozenset({DType.f32, DType.f64})  # rule 3


def _close(x: float | None, want: float) -> bool:
    # exporters write the constants in float32: allow its rounding, nothing looser
    return x is not None and abs(x - want) <= 1e-6 * abs(want)


def _other(node: Node, v: Value) -> Value | None:
    """The operand of binary ``node`` that is not ``v`` (None when both are ``v``)."""
    a, b = node.inputs[0], node.inputs[1]
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


@register_pass
@dataclass(frozen=True)
class RecognizeGelu(GraphPass):
    """Turns GELU written out with Erf into the ``gelu`` op (one kernel, no cancellation).

    1. The pattern is ``x * 0.5 * (1 + erf(x / sqrt(2)))`` in any association and operand order
       of the products (the 0.5 may be a division by 2), with ``x / sqrt(2)`` also written
       ``x * (1 / sqrt(2))``; the constants must match to float32 rounding.
    2. Every intermediate value of the pattern has exactly one reader (so removing it removes
       nothing else) and is not a graph output; the pattern's result keeps its name.
    3. Only float tensors (f32, f64) are rewritten; the ``gelu`` op computes
       ``0.5 * x * erfc(-x / sqrt(2))``, equal to the pattern up to rounding.
    """

    name: ClassVar[str] = "recognize-gelu"

    def run_on(self, g: Graph) -> bool:
        counts = use_counts(g)
        users = g.users()
        replaced: dict[Node, list[Node]] = {}
        removed: set[Node] = set()
        consts: list[Value] = []

        def only_user(v: Value, *ops: str) -> Node | None:
            us = users.get(v, [])
            if counts.get(v, 0) != 1 or len(us) != 1 or us[0].op not in ops or us[0] in removed:
                return None
            return us[0]

        for erf in g.nodes:
            if erf.op != "erf" or erf in removed or erf.outputs[0].type.dtype not in _GELU_DTYPES:
                continue
            scaled = erf.inputs[0]
            pre = scaled.producer if scaled is not None else None
            if scaled is None or pre is None or pre.op not in ("div", "mul") or counts.get(scaled, 0) != 1:
                continue
            x = pre.inputs[0]
            if pre.op == "div":
                ok = _close(scalar_const(pre.inputs[1]), _SQRT2)
            else:
                x = pre.inputs[0] if scalar_const(pre.inputs[1]) is not None else pre.inputs[1]
                ok = x is not None and _close(scalar_const(_other(pre, x)), 1 / _SQRT2)
            if not ok or x is None or x.type != erf.outputs[0].type:
                continue
            plus = only_user(erf.outputs[0], "add")
            if plus is None or not _close(scalar_const(_other(plus, erf.outputs[0])), 1.0):
                continue
            match = self._product(plus.outputs[0], x, only_user)
            if match is None:
                continue
            root, products = match
            gelu = Node("gelu", [x], list(root.outputs), {"approximate": "none"}, root.name)
            replaced[root] = [gelu]
            removed.update([pre, erf, plus, *products])
            consts.extend(v for n in (pre, plus, *products) for v in n.inputs if v is not None)
        if not replaced:
            return False
        rebuild(g, replaced, removed - set(replaced))
        drop_unused_constants(g, consts)
        return True

    @staticmethod
    def _product(s: Value, x: Value, user: Callable[..., Node | None]) -> tuple[Node, list[Node]] | None:
        """The products forming ``x * 0.5 * s``: (the node giving the result, every product node).

        ``user(v, *ops)`` is ``v``'s only reader when it is one of ``ops`` and ``v`` is read once."""
        m1 = user(s, "mul")
        if m1 is None:
            return None
        o1 = _other(m1, s)
        if o1 is x:  # (x * s) * 0.5, or (x * s) / 2
            m2 = user(m1.outputs[0], "mul", "div")
            if m2 is None:
                return None
            if m2.op == "mul" and _close(scalar_const(_other(m2, m1.outputs[0])), 0.5):
                return m2, [m1, m2]
            if m2.op == "div" and m2.inputs[0] is m1.outputs[0] and _close(scalar_const(m2.inputs[1]), 2.0):
                return m2, [m1, m2]
            return None
        if _close(scalar_const(o1), 0.5):  # (s * 0.5) * x
            m2 = user(m1.outputs[0], "mul")
            if m2 is not None and _other(m2, m1.outputs[0]) is x:
                return m2, [m1, m2]
            return None
        inner = o1.producer if o1 is not None else None  # s * (x * 0.5)
        if inner is not None and inner.op == "mul" and user(o1, "mul") is m1:
            other = _other(inner, x)
            if other is not None and _close(scalar_const(other), 0.5):
                return m1, [inner, m1]
        return None


# fuse-elementwise ------------------------------------------------------------------------------


@register_pass
@dataclass(frozen=True)
class FuseElementwise(GraphPass):
    """Fuses chains of elementwise ops into one ``fused_elementwise`` node (one loop).

    1. A group grows from its last node (the root) towards its operands: a producer joins when
       it is elementwise (the rules of ``cuvil/ops/fused.py``: float values, no regions),
       its output is read exactly once (by the group) and is not a graph output, and its output
       has the root's type.  So a group is a tree, every intermediate is computed once per output
       element and no work is duplicated (a value read twice stays a tensor).
    2. A group holds at most ``max_ops`` nodes, and at least two (one op is already one loop).
    3. The fused node takes the root's place and output value (its name stays); its operands are
       the distinct values the group reads from outside, in order of first reading.
    4. Regions of control-flow nodes are fused on their own; fused ops' regions are left alone.
    5. Conv/Gemm/MatMul epilogues are fused before this pass runs (``fuse-epilogue``), so the
       chains left here are those no such producer heads.
    """

    name: ClassVar[str] = "fuse-elementwise"
    max_ops: int = 16

    def run_on(self, g: Graph) -> bool:
        counts = use_counts(g)
        here = set(g.nodes)
        grouped: set[Node] = set()
        replaced: dict[Node, list[Node]] = {}
        for root in reversed(g.nodes):
            if root in grouped or not fusable(root):
                continue
            want = root.outputs[0].type
            group, frontier = [root], [root]
            while frontier:
                n = frontier.pop()
                for v in n.inputs:
                    p = v.producer if v is not None else None
                    if (v is None or p is None or p not in here or p in grouped or p in group
                            or len(group) >= self.max_ops or not fusable(p)
                            or counts.get(v, 0) != 1 or v.type != want):
                        continue
                    group.append(p)
                    frontier.append(p)
            if len(group) < 2:
                continue
            grouped.update(group)
            order = {n: i for i, n in enumerate(g.nodes)}
            group.sort(key=order.__getitem__)
            out = root.outputs[0]
            region, externals = build_region("body", g, group, out)
            replaced[root] = [Node("fused_elementwise", list(externals), [out], {"body": region}, root.name)]
        if not replaced:
            return False
        rebuild(g, replaced, grouped - set(replaced))
        return True


def group_ops(node: Node) -> list[str]:
    """The ops a fused node runs (its base op, then its region's), for logs and tests."""
    ops = [] if node.op == "fused_elementwise" else [node.op.removeprefix("fused_")]
    for _, r in node.regions():
        ops.extend(n.op for n in r.nodes)
    return ops


# ``nested_graphs`` lives in ``cuvil.passes.base`` (it drives :class:`GraphPass`); passes that walk
# the graphs themselves still import it from here with the other helpers.
__all__ = ["FuseElementwise", "RecognizeGelu", "build_region", "fusable", "group_ops", "nested_graphs",
           "use_counts"]

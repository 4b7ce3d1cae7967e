"""Canonicalization: local rewrites that remove work a node does not need to do.

The pass owns a small rule set; each rule looks at one node (and at most the
node that defines one of its inputs) and either forwards an existing value in
place of the node's output or rewrites the node in place.  Nodes left without
readers are left for ``dce``: passes do one thing each.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import is_unknown
from cuvil.passes.base import Pass, PassResult, register_pass
from cuvil.passes.rewrite import (
    Substitution,
    can_replace,
    defined_by_nodes,
    replace_value,
    resolve_inputs,
    resolve_outputs,
)

# Ops that only reinterpret the shape of their first input (row-major order kept).
_RESHAPES = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})
# Ops that return their first input unchanged whenever their output type equals its type.
_NOOP_WHEN_SAME_TYPE = frozenset({"identity", "reshape", "flatten", "squeeze", "expand", "cast", "concat"})
_INVOLUTIONS = frozenset({"neg", "not"})
_FLOAT_BASES = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64})


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    """Local simplifications, applied in graph order (regions included) until nothing changes.

    1. ``identity(x)`` is ``x``; so are ``reshape``, ``flatten``, ``squeeze``, ``expand``, ``cast``
       and a one-input ``concat`` whose output type equals the type of ``x`` and has no unknown dim
       (``?``: two of them may be different sizes).
    2. ``transpose(transpose(x, p), q)`` becomes ``transpose(x, p∘q)``; a transpose whose
       permutation keeps every axis in place is ``x``.
    3. ``reshape(r(x), s)``, where ``r`` is a reshape, flatten, squeeze or unsqueeze and ``s`` is a
       constant with no ``0`` entry (or ``allowzero`` is set), becomes ``reshape(x, s)``.
    4. ``x * 1``, ``1 * x``, ``x / 1``, ``x + 0``, ``0 + x`` and ``x - 0`` with a constant of ones or
       zeros are ``x`` when the output type equals the type of ``x`` and either has no unknown dim
       or the constant's dims are all 1 (no broadcast widening).
       ``x + 0.0`` turns ``-0.0`` into ``+0.0``; the rewrite keeps ``-0.0`` (signed zeros compare
       equal, and every inference compiler takes this freedom).
    5. ``neg(neg(x))`` and ``not(not(x))`` are ``x``.
    6. ``gemm`` reading a 2-D ``transpose`` as ``A`` or ``B`` reads the transpose's input, with
       ``transA`` or ``transB`` flipped: the kernel reads either layout, where the transpose
       would copy its operand on every call (``torch.export`` gives every ``nn.Linear`` as
       ``addmm(bias, x, permute(weight))``).
    7. ``pow(x, c)`` of a float ``x`` by a constant exponent whose every element is 1, 2 or 3
       (and that does not widen ``x``) is ``x``, ``x * x`` or ``(x * x) * x``: exporters write
       squares and cubes (RMSNorm's ``x.pow(2)``, GPT-2's tanh GELU) as ``Pow``, which the
       targets would compute with a general power function, one element at a time.  A square is
       exactly ``powf``'s correctly rounded result; a cube rounds twice (within one unit in the
       last place of the power).

    A replacement never changes the graph's signature: a graph (or region) output is only
    replaced by a value defined by a node of the same graph, which then takes the output's name;
    otherwise the node stays.  A rewrite in place is kept only if the node's op infers the same
    output types as before.
    """

    name: ClassVar[str] = "canonicalize"
    max_iterations: int = 8

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError("max-iterations must be at least 1")

    def run(self, graph: Graph) -> PassResult:
        changed = False
        for _ in range(self.max_iterations):
            subst: Substitution = {}
            if not _sweep(graph, subst):
                break
            changed = True
        return PassResult(graph, changed)


def _sweep(graph: Graph, subst: Substitution) -> bool:
    """One pass over ``graph`` in order; replaced nodes are dropped.  Whether anything changed."""
    changed = False
    local = defined_by_nodes(graph)
    kept: list[Node] = []
    for node in graph.nodes:
        changed |= resolve_inputs(node, subst)
        for _, region in node.regions():
            changed |= _sweep(region, subst)
            changed |= resolve_outputs(region, subst)
        forward = _forwarded(node)
        if forward is not None and can_replace(graph, node.outputs[0], forward, local):
            replace_value(graph, node.outputs[0], forward, subst)
            changed = True
            continue
        changed |= _rewrite_in_place(node, graph)
        square = _power_as_products(node)
        if square is not None:
            kept.append(square)
            changed = True
        kept.append(node)
    graph.nodes = kept
    return changed


def _producer(v: Value | None, op: str | frozenset[str]) -> Node | None:
    if v is None or v.producer is None:
        return None
    ops = {op} if isinstance(op, str) else op
    return v.producer if v.producer.op in ops else None


def _const(v: Value | None) -> np.ndarray | None:
    p = _producer(v, "constant")
    return None if p is None else np.asarray(p.attrs["value"])


def _all_equal(v: Value | None, x: float) -> bool:
    c = _const(v)
    return c is not None and c.size > 0 and bool(np.all(c == x))


def _forwarded(node: Node) -> Value | None:
    """The existing value that ``node``'s single output equals, by rules 1, 2, 4 and 5."""
    if len(node.outputs) != 1 or not node.inputs or node.inputs[0] is None:
        return None
    out, x = node.outputs[0], node.inputs[0]
    if node.op in ("identity", "cast") and x.type == out.type:
        return x  # whatever its dims: neither changes the shape
    if node.op in _NOOP_WHEN_SAME_TYPE and _same_type(x, out) and (node.op != "concat" or len(node.inputs) == 1):
        return x
    if node.op == "transpose" and _is_identity_perm(node.attrs.get("perm"), out.type.rank):
        return x
    if node.op in _INVOLUTIONS and (inner := _producer(x, node.op)) is not None and inner.inputs[0] is not None:
        return inner.inputs[0]
    if len(node.inputs) == 2 and node.inputs[1] is not None:
        a, b = x, node.inputs[1]
        if node.op == "pow" and _power_exponent(node) == 1:
            return x
        unit: dict[str, list[tuple[Value, Value]]] = {
            "mul": [(a, b), (b, a)],
            "div": [(a, b)],
        }
        zero: dict[str, list[tuple[Value, Value]]] = {
            "add": [(a, b), (b, a)],
            "sub": [(a, b)],
        }
        for keep, other in unit.get(node.op, []):
            if _no_widening(keep, other, out) and _all_equal(other, 1):
                return keep
        for keep, other in zero.get(node.op, []):
            if _no_widening(keep, other, out) and _all_equal(other, 0):
                return keep
    return None


def _same_type(x: Value, out: Value) -> bool:
    """Whether ``out`` has the type of ``x`` for certain: an unknown dim (``?``) equals another in the type
    but may hold another size (a reshape of f32[?, ?] to f32[?, ?] is no identity)."""
    return x.type == out.type and not any(is_unknown(d) for d in out.type.shape)


def _no_widening(keep: Value, other: Value, out: Value) -> bool:
    """Whether ``keep op other`` has ``keep``'s shape for certain: its type is known to be kept, or
    ``other`` is all 1s (a scalar, say), which never widens a dim, known or not."""
    t = other.type
    return _same_type(keep, out) or (keep.type == out.type and t.rank <= keep.type.rank
                                     and all(isinstance(d, int) and d == 1 for d in t.shape))


def _is_identity_perm(perm: object, rank: int) -> bool:
    if perm is None:
        return rank <= 1
    assert isinstance(perm, list | tuple)
    return [int(p) for p in perm] == list(range(rank))


def _rewrite_in_place(node: Node, graph: Graph) -> bool:
    """Rules 2, 3 and 6: the node reads through its input's producer.  Whether it was rewritten."""
    x = node.inputs[0] if node.inputs else None
    if node.op == "transpose" and (inner := _producer(x, "transpose")) is not None and inner.inputs[0] is not None:
        rank = node.outputs[0].type.rank
        p = _perm(inner.attrs.get("perm"), rank)
        q = _perm(node.attrs.get("perm"), rank)
        source = inner.inputs[0]
        return _try(node, graph, lambda: _set(node, [source], perm=[p[i] for i in q]))
    if node.op == "reshape" and (inner := _producer(x, _RESHAPES)) is not None and inner.inputs[0] is not None:
        shape = _const(node.inputs[1])
        if shape is None or (0 in shape.reshape(-1).tolist() and not node.attrs.get("allowzero")):
            return False
        source = inner.inputs[0]
        return _try(node, graph, lambda: _set(node, [source, node.inputs[1]]))
    if node.op == "gemm":
        rewritten = False
        for i, flag in ((0, "transA"), (1, "transB")):
            inner = _producer(node.inputs[i] if len(node.inputs) > i else None, "transpose")
            if inner is None or inner.inputs[0] is None or inner.outputs[0].type.rank != 2:
                continue
            inputs = list(node.inputs)
            inputs[i] = inner.inputs[0]
            flipped = 0 if int(node.attrs.get(flag, 0)) else 1
            rewritten |= _try(node, graph, functools.partial(_set, node, inputs, **{flag: flipped}))
        return rewritten
    return False


def _power_exponent(node: Node) -> int | None:
    """Rule 7: the exponent (1, 2 or 3) of a ``pow`` of a float base by a constant that does not widen it."""
    if node.op != "pow" or len(node.inputs) != 2 or node.inputs[0] is None or node.inputs[1] is None:
        return None
    x, e, out = node.inputs[0], node.inputs[1], node.outputs[0]
    c = _const(e)
    if x.type.dtype not in _FLOAT_BASES or c is None or c.size == 0 or not _no_widening(x, e, out):
        return None
    first = c.reshape(-1)[0]
    if not np.all(c == first) or float(first) not in (1.0, 2.0, 3.0):
        return None
    return int(first)


def _power_as_products(node: Node) -> Node | None:
    """Rule 7 in place: ``pow(x, 2)`` becomes ``mul(x, x)``; ``pow(x, 3)`` becomes ``mul(s, x)`` and
    the new node ``s = mul(x, x)`` that it returns (to be placed before it)."""
    n = _power_exponent(node)
    if n not in (2, 3):
        return None
    x, out = node.inputs[0], node.outputs[0]
    assert x is not None
    if n == 2:
        node.op, node.inputs, node.attrs = "mul", [x, x], {}
        return None
    square = Value(f"{out.name}_square", x.type)
    node.op, node.inputs, node.attrs = "mul", [square, x], {}
    return Node("mul", [x, x], [square], {}, f"{node.name}_square" if node.name else "")


def _perm(perm: object, rank: int) -> list[int]:
    if perm is None:
        return list(range(rank))[::-1]
    assert isinstance(perm, list | tuple)
    return [int(p) for p in perm]


def _set(node: Node, inputs: list[Value | None], **attrs: object) -> None:
    node.inputs = inputs
    node.attrs.update(attrs)


def _try(node: Node, graph: Graph, rewrite: Callable[[], None]) -> bool:
    """Apply ``rewrite`` to ``node``; undo it unless the op still infers the node's output types."""
    from cuvil.ops.common import infer_types

    saved_inputs, saved_attrs = list(node.inputs), dict(node.attrs)
    rewrite()
    try:
        types, full = infer_types(node.op, node.inputs, node.attrs, len(node.outputs), graph.symbols)
    except CuvilError:
        types = []
    if types != [o.type for o in node.outputs]:
        node.inputs, node.attrs = saved_inputs, saved_attrs
        return False
    node.attrs = full
    return True

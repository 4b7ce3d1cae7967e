"""Constant folding: nodes computable at compile time become constants.

This module owns Cuvil's one folding rule, :func:`fold_node`, which both this
pass and the ONNX importer (folding small results while it builds the graph)
call.  The pass adds one rule of its own: a size vector whose contents shape
inference already knows as integers (``sym_value``) is folded even when the
tensor it was measured from has symbolic dims elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.passes.base import Pass, PassResult, register_pass

# The largest result (in elements) the pass folds by default: shape arithmetic and small
# tables fold, while a transposed or scaled copy of a large weight is left to the kernels.
DEFAULT_MAX_ELEMENTS = 1 << 20


def _static(t: TensorType) -> tuple[int, ...] | None:
    dims = tuple(d for d in t.shape if isinstance(d, int))
    return dims if len(dims) == t.rank else None


def fold_node(node: Node, max_elements: float = DEFAULT_MAX_ELEMENTS) -> list[np.ndarray] | None:
    """The outputs of ``node`` when they can be computed now, else None.

    A node folds when every input is a constant (or, for an op with the shape-only trait,
    has a static shape), its outputs are static with at most ``max_elements`` elements
    each, and its op is neither control flow nor nondeterministic.  The result is the op's
    NumPy reference, the same code the reference interpreter runs.  A reference that
    fails, or disagrees with the node's types, leaves the node in place for the
    interpreter to report when the graph runs."""
    from cuvil.ops.common import const_of
    from cuvil.ops.registry import CONTROL_FLOW, KEEP_OPERANDS, NONDETERMINISTIC, SHAPE_ONLY, RefCtx, lookup

    opdef = lookup(node.op)
    if node.op == "constant" or opdef is None or opdef.reference is None:
        return None
    if opdef.traits & {CONTROL_FLOW, NONDETERMINISTIC, KEEP_OPERANDS} or any(True for _ in node.regions()):
        return None
    outs = [v.type for v in node.outputs]
    if not all((s := _static(t)) is not None and math.prod(s) <= max_elements for t in outs):
        return None
    args: list[np.ndarray | None] = []
    for v in node.inputs:
        c = const_of(v)
        if v is None or c is not None:
            args.append(c)
        elif SHAPE_ONLY in opdef.traits and (s := _static(v.type)) is not None:
            args.append(np.broadcast_to(np.zeros((), v.type.dtype.np), s))  # only the shape is read
        else:
            return None
    try:
        values = [np.asarray(a) for a in opdef.reference(RefCtx(node.op, args, node.attrs, outs))]
    except Exception:  # the interpreter reports it, with the node, when the graph runs
        return None
    if len(values) < len(outs) or any(a.dtype != t.dtype.np or a.shape != t.shape for a, t in zip(values, outs)):
        return None
    return [np.array(a) for a in values[: len(outs)]]


def fold_sizes(node: Node) -> list[np.ndarray] | None:
    """The outputs of ``node`` when each is an integer vector or scalar whose contents shape
    inference knows as plain integers (``Value.sym_value``), else None."""
    if node.op == "constant" or not node.outputs or any(True for _ in node.regions()):
        return None
    out: list[np.ndarray] = []
    for v in node.outputs:
        shape = _static(v.type)
        sv = v.sym_value
        if shape is None or sv is None or v.type.dtype.np.kind not in "iu" or v.type.rank > 1:
            return None
        ints = [d for d in sv if isinstance(d, int)]
        if len(ints) != len(sv) or len(ints) != math.prod(shape):
            return None
        out.append(np.array(ints, dtype=v.type.dtype.np).reshape(shape))
    return out


@register_pass
@dataclass(frozen=True)
class FoldConstants(Pass):
    """Replaces nodes whose results are known at compile time by constants, in graph order.

    1. A node whose inputs are all constants is replaced by its op's reference result
       (:func:`fold_node`); for ops with the shape-only trait (``shape``, ``size``, ...) an
       input only needs a static shape.
    2. An integer vector or scalar whose contents shape inference knows as integers is
       replaced by those integers, even when the tensor it was measured from has symbolic
       dims (``shape(x)[1:]`` of an ``f32[batch, 3, 224, 224]`` is ``[3, 224, 224]``).
    3. Control-flow, nondeterministic and keep-operands ops (``dequantize_linear``) are never
       folded, nor results of more than ``max-elements`` elements (so weights are not copied
       into transformed duplicates), unless folding costs no constant bytes: every input is a
       constant of the graph that only this node reads (and not a graph output), and the
       results are no larger than those inputs.  A transposed, reshaped or scaled weight then
       replaces the weight instead of being computed again on every call.  A ``transpose`` of
       constants folds whatever its size: left in the graph, it would copy the weight on every
       call into arena bytes as large as the folded copy (a weight read both as it is and
       transposed: an embedding tied to the output layer).
    4. Folded nodes become one ``constant`` node per output, defining the same values (names
       and types kept); the folded node's own inputs are left to ``dce``.
    5. Every other node's types are re-derived as it is visited, since a constant operand can
       make them more precise (a ``slice`` whose bounds were computed gets a static shape).
       Rules 1 and 2 therefore collapse chains (``shape -> gather -> concat -> reshape``) in
       one pass.
    """

    name: ClassVar[str] = "fold-constants"
    max_elements: int = DEFAULT_MAX_ELEMENTS

    def __post_init__(self) -> None:
        if self.max_elements < 0:
            raise ValueError("max-elements must not be negative")

    def run(self, graph: Graph) -> PassResult:
        return PassResult(graph, _fold_graph(graph, self.max_elements, graph.symbols) > 0)


def _fold_graph(graph: Graph, max_elements: int, symbols: dict[str, SymbolInfo], top: bool = True) -> int:
    folded = 0
    nodes: list[Node] = []
    # Readers per value, for folding that replaces its inputs.  In a region, values of the
    # enclosing graphs may have readers this graph does not see: there it is not tried.
    users = graph.users() if top else None
    for node in graph.nodes:
        for _, region in node.regions():
            folded += _fold_graph(region, max_elements, symbols, top=False)
        if node.op != "constant":
            _refresh(node, symbols)
        unbounded = node.op == "transpose" or (users is not None and _replaces_its_inputs(node, graph, users))
        limit = math.inf if unbounded else max_elements
        values = fold_node(node, limit)
        if values is None:
            values = fold_sizes(node)
        if values is None:
            nodes.append(node)
            continue
        nodes.extend(_constant(v, a, node.name, symbols) for v, a in zip(node.outputs, values))
        folded += 1
    graph.nodes = nodes
    return folded


def _replaces_its_inputs(node: Node, graph: Graph, users: dict[Value, list[Node]]) -> bool:
    """Whether folding ``node`` adds no constant bytes: each input is a constant that only ``node``
    reads and that is not an output of ``graph``, and its static outputs are no larger than them."""
    ins = {v for v in node.inputs if v is not None}
    if not ins or node.op == "constant":
        return False
    in_bytes = 0
    for v in ins:
        if v.producer is None or v.producer.op != "constant" or v in graph.outputs or len(users.get(v, ())) != 1:
            return False
        in_bytes += np.asarray(v.producer.attrs["value"]).nbytes
    out_bytes = 0
    for v in node.outputs:
        shape = _static(v.type)
        if shape is None:
            return False
        out_bytes += math.prod(shape) * v.type.dtype.np.itemsize
    return out_bytes <= in_bytes


def _refresh(node: Node, symbols: dict[str, SymbolInfo]) -> None:
    """Re-derive the node's output types and known contents from its (possibly folded) inputs.

    An inference failure leaves the node as it was, for the verifier to report."""
    from cuvil.ops.common import infer_all

    try:
        types, _, syms = infer_all(node.op, node.inputs, node.attrs, len(node.outputs), symbols)
    except CuvilError:
        return
    for v, t, s in zip(node.outputs, types, syms):
        v.type, v.sym_value = t, s


def _constant(v: Value, a: np.ndarray, loc: str, symbols: dict[str, SymbolInfo]) -> Node:
    from cuvil.ops.common import infer_all

    n = Node("constant", [], [v], {"value": a}, loc)
    _, _, syms = infer_all("constant", [], n.attrs, 1, symbols)
    v.sym_value = syms[0]
    return n

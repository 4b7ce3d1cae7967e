"""``recognize-layernorm``: LayerNorm written out with reductions becomes the ``layer_norm`` op.

Exporters that predate ONNX's LayerNormalization (torch.onnx before opset 17, hand-written
models) spell it as

    m = ReduceMean(x, axes);  d = x - m;  v = ReduceMean(d * d or d ** 2, axes)
    y = d / Sqrt(v + eps)  (or d * Reciprocal(Sqrt(v + eps)));  y * gamma;  + beta

which runs as nine kernels and four passes over ``x``.  ``layer_norm`` computes it in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of
from cuvil.passes.base import GraphPass, register_pass
from cuvil.passes.fuse_elementwise import drop_unused_constants, rebuild, scalar_const, use_counts

_DTYPES = ("f32", "f64")


def _trailing_axes(node: Node, rank: int) -> int | None:
    """How many trailing axes a keepdims ``reduce_mean`` node reduces (None: not trailing axes)."""
    if node.op != "reduce_mean" or node.attrs.get("keepdims", 1) != 1 or len(node.inputs) < 2:
        return None
    axes = const_of(node.inputs[1])
    if axes is None or axes.size == 0:
        return None
    got = sorted({int(a) % rank for a in axes.reshape(-1)})
    if len(got) != axes.size or got != list(range(rank - len(got), rank)):
        return None
    return len(got)


@register_pass
@dataclass(frozen=True)
class RecognizeLayerNorm(GraphPass):
    """Turns LayerNorm written out with reductions into the ``layer_norm`` op.

    1. The pattern is ``d = x - reduce_mean(x)``, ``v = reduce_mean(d * d)`` (or ``pow(d, 2)``),
       ``n = d / sqrt(v + eps)`` (or ``d * reciprocal(sqrt(v + eps))``), then optionally
       ``n * gamma`` and ``+ beta`` (either operand order).
    2. Both means reduce the same trailing axes of ``x`` with keepdims; ``eps`` is a one-element
       float constant; ``gamma`` and ``beta`` (when present) keep the type of ``x`` when applied,
       so they broadcast onto ``x`` as ``layer_norm``'s Scale and B do.
    3. Every intermediate value has only the readers the pattern gives it (``d``: the square
       and the normalization) and is not a graph output; the result keeps its name.
    4. Only f32 and f64 tensors are rewritten.  Without ``gamma`` the Scale is a constant of
       ones (multiplying by one is exact).  The op computes ``d * (1 / sqrt(v + eps))``:
       equal to the pattern up to rounding.
    """

    name: ClassVar[str] = "recognize-layernorm"

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

        for mean in g.nodes:
            if mean.op != "reduce_mean" or mean in removed or mean.inputs[0] is None:
                continue
            x = mean.inputs[0]
            if x.type.dtype.value not in _DTYPES:
                continue
            axes = _trailing_axes(mean, x.type.rank)
            if axes is None:
                continue
            sub = only_user(mean.outputs[0], "sub")
            if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean.outputs[0]:
                continue
            d = sub.outputs[0]
            if d.type != x.type:
                continue
            match = self._match_rest(d, axes, users, counts, removed)
            if match is None:
                continue
            nodes, root, gamma, beta, eps = match
            new: list[Node] = []
            if gamma is None:
                shape = [d for d in x.type.shape[x.type.rank - axes:] if isinstance(d, int)]
                if len(shape) != axes:  # the ones need a static shape
                    continue
                gamma = Value(f"{root.outputs[0].name}.scale", TensorType(x.type.dtype, tuple(shape)))
                new.append(Node("constant", [], [gamma], {"value": np.ones(shape, x.type.dtype.np)},
                                f"{root.name}/scale"))
            attrs = {"axis": -axes, "epsilon": eps, "stash_type": x.type.dtype}
            new.append(Node("layer_norm", [x, gamma, beta], list(root.outputs), attrs, root.name))
            replaced[root] = new
            removed.update([mean, sub, *nodes])
            consts.extend(v for n in (mean, *nodes) for v in n.inputs if v is not None)
        if not replaced:
            return False
        rebuild(g, replaced, removed - set(replaced))
        drop_unused_constants(g, consts)
        return True

    @staticmethod
    def _match_rest(d: Value, axes: int, users: dict[Value, list[Node]],
                    counts: dict[Value, int], removed: set[Node],
                    ) -> tuple[list[Node], Node, Value | None, Value | None, float] | None:
        """The nodes after ``d = x - mean``: (those the root replaces, the root, gamma, beta, eps), or None."""
        us = [u for u in users.get(d, []) if u not in removed]
        square = next((u for u in us if u.op == "mul" and u.inputs[0] is d and u.inputs[1] is d), None)
        if square is None:
            square = next((u for u in us if u.op == "pow" and u.inputs[0] is d
                           and scalar_const(u.inputs[1]) == 2.0), None)
        if square is None:
            return None
        norm = next((u for u in us if u is not square and u.op in ("div", "mul") and u.inputs[0] is d), None)
        if norm is None or counts.get(d, 0) != (3 if square.op == "mul" else 2) or len(us) != 2:
            return None

        def single(v: Value, op: str) -> Node | None:
            u = users.get(v, [])
            return u[0] if counts.get(v, 0) == 1 and len(u) == 1 and u[0].op == op else None

        var = single(square.outputs[0], "reduce_mean")
        if var is None or _trailing_axes(var, d.type.rank) != axes:
            return None
        add = single(var.outputs[0], "add")
        if add is None or add.inputs[0] is not var.outputs[0] or add.outputs[0].type != var.outputs[0].type:
            return None
        eps = scalar_const(add.inputs[1])
        if eps is None or eps < 0:
            return None
        sqrt = single(add.outputs[0], "sqrt")
        if sqrt is None:
            return None
        chain = [square, var, add, sqrt]
        if norm.op == "div":
            if norm.inputs[1] is not sqrt.outputs[0] or counts.get(sqrt.outputs[0], 0) != 1:
                return None
        else:
            recip = single(sqrt.outputs[0], "reciprocal")
            if recip is None or norm.inputs[1] is not recip.outputs[0] or counts.get(recip.outputs[0], 0) != 1:
                return None
            chain.append(recip)
        chain.append(norm)
        root, gamma, beta = norm, None, None
        nxt = single(root.outputs[0], "mul")
        if nxt is not None:
            other = nxt.inputs[1] if nxt.inputs[0] is root.outputs[0] else nxt.inputs[0]
            if other is not root.outputs[0] and nxt.outputs[0].type == d.type and _fits(other, d, axes):
                chain.append(nxt)
                root, gamma = nxt, other
        nxt = single(root.outputs[0], "add") if gamma is not None else None
        if nxt is not None:
            other = nxt.inputs[1] if nxt.inputs[0] is root.outputs[0] else nxt.inputs[0]
            if other is not root.outputs[0] and nxt.outputs[0].type == d.type and _fits(other, d, axes):
                chain.append(nxt)
                root, beta = nxt, other
        return chain[:-1], root, gamma, beta, eps


def _fits(p: Value | None, x: Value, axes: int) -> bool:
    """Whether ``p`` is a float tensor of ``x``'s element type over ``x``'s last ``axes`` dims at most."""
    return (p is not None and p.type.dtype == x.type.dtype and p.type.rank <= axes
            and all(a == b or a == 1 for a, b in zip(p.type.shape, x.type.shape[x.type.rank - p.type.rank:])))


__all__ = ["RecognizeLayerNorm"]

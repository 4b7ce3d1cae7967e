"""``fuse-attention``: scaled dot-product attention written out becomes one ``attention`` node.

Exported transformers spell attention as ``matmul(Q, Kᵀ) -> scale -> + mask -> softmax ->
matmul(·, V)``: five kernels, with the ``[batch, heads, seq, seq]`` scores written to memory
and read back three times.  The ``attention`` op (``cuvil/ops/attention.py``) computes it in
one kernel that keeps the scores in cache.  The head split around the core (reshapes and
transposes of Q, K, V and of the result) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.registry import get
from cuvil.passes.base import GraphPass, register_pass
from cuvil.passes.fuse_elementwise import drop_unused_constants, rebuild, scalar_const, use_counts

_Single = Callable[[Value | None], bool]
_Producer = Callable[..., Node | None]


@register_pass
@dataclass(frozen=True)
class FuseAttention(GraphPass):
    """Fuses ``matmul(Q, Kᵀ) -> scale -> + mask -> softmax -> matmul(·, V)`` into ``attention``.

    1. The core is ``softmax(s, axis=-1)`` of rank-4 f32 scores ``s`` whose only reader is
       ``matmul(softmax(s), V)``; ``s`` is ``matmul(A, B)``, optionally then ``* c`` or ``/ c``
       (``c`` a one-element constant), optionally then ``+ mask`` (either order).
    2. ``A`` is ``[b, h, sq, dk]``, ``B`` is ``[b, h, dk, skv]``, ``V`` is ``[b, h, skv, dv]``:
       no broadcasting between them (same batch and head dims).  When the scores are not
       scaled and ``A = Q * c`` and ``B = Kt * c`` with one constant ``c`` (torch's
       decomposition of scaled_dot_product_attention), the op takes ``Q`` and ``Kt`` with
       ``scale_mode="split"`` and ``scale = c²`` (so that ``sqrt(scale)`` is ``c`` again).
    3. The mask has the scores' element type and rank at most 4, broadcasts onto the scores
       without changing their type, and its last dim is the key count (ONNX's attention pads a
       shorter mask instead of broadcasting it).
    4. Every intermediate value has exactly one reader and is not a graph output.  The op wants
       K as ``[b, h, skv, dk]``: when ``B`` is a transpose read only here, that transpose is
       rewritten to give K (the two permutations composed; none when they cancel); otherwise a
       transpose of ``B`` is added.
    5. The ``attention`` node takes the final matmul's place, output and name, with
       ``guard_masked_rows=0``: a row masked everywhere gives NaN, as the softmax did.
    """

    name: ClassVar[str] = "fuse-attention"

    def run_on(self, g: Graph) -> bool:
        counts = use_counts(g)
        users = g.users()
        replaced: dict[Node, list[Node]] = {}
        removed: set[Node] = set()
        consts: list[Value] = []

        def single(v: Value | None) -> bool:
            return v is not None and counts.get(v, 0) == 1

        def producer(v: Value | None, *ops: str) -> Node | None:
            p = v.producer if v is not None else None
            return p if p is not None and p.op in ops and p not in removed and p not in replaced else None

        for sm in g.nodes:
            if sm.op != "softmax" or sm in removed or sm.attrs.get("coerce_2d", 0):
                continue
            s = sm.inputs[0]
            if s is None or s.type.rank != 4 or s.type.dtype is not DType.f32 or sm.attrs.get("axis", -1) not in (-1, 3):
                continue
            p = sm.outputs[0]
            pv = users.get(p, [])
            if not single(p) or len(pv) != 1 or pv[0].op != "matmul" or pv[0].inputs[0] is not p:
                continue
            final = pv[0]
            v = final.inputs[1]
            chain = [sm]
            mask = None
            add = producer(s, "add")
            if add is not None and single(s):
                for inner, other in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
                    if (inner is not None and other is not None and inner.type == s.type
                            and producer(inner, "mul", "div", "matmul") is not None and _mask_ok(other, s.type)):
                        mask, s = other, inner
                        chain.append(add)
                        break
            scale_mode, scale = "mul", 1.0
            sc = producer(s, "mul", "div")
            if sc is not None and single(s):
                c = scalar_const(sc.inputs[1])
                if c is None and sc.op == "mul":
                    c = scalar_const(sc.inputs[0])
                    inner = sc.inputs[1]
                else:
                    inner = sc.inputs[0]
                if c is not None and inner is not None and inner.type == s.type:
                    scale_mode, scale, s = ("div" if sc.op == "div" else "mul"), c, inner
                    chain.append(sc)
            mm = producer(s, "matmul")
            if mm is None or not single(s):
                continue
            a, b = mm.inputs[0], mm.inputs[1]
            if a is None or b is None or v is None or not _shapes_ok(a.type, b.type, v.type, s.type):
                continue
            chain.append(mm)
            if chain[-2].op not in ("mul", "div"):  # unscaled scores: maybe torch's split scale
                split = _split_scale(a, b, single, producer)
                if split is not None:
                    c, qa, qb, muls = split
                    scale_mode, scale, a, b = "split", c * c, qa, qb
                    chain.extend(muls)
            new: list[Node] = []
            k_val = _keys(b, single, producer, new, removed)
            attrs = {name: spec.default for name, spec in get("attention").attrs.items()}
            attrs.update(scale=float(scale), scale_mode=scale_mode, guard_masked_rows=0)
            node = Node("attention", [a, k_val, v, mask], list(final.outputs), attrs, final.name)
            replaced[final] = [*new, node]
            removed.update(chain)
            consts.extend(x for n in chain for x in n.inputs if x is not None)
        if not replaced:
            return False
        rebuild(g, replaced, removed - set(replaced))
        drop_unused_constants(g, consts)
        return True

def _keys(b: Value, single: _Single, producer: _Producer, new: list[Node], removed: set[Node]) -> Value:
    """K (``[b, h, skv, dk]``) from ``B`` (its last two dims swapped), made by a new transpose."""
    t = producer(b, "transpose")
    k = Value(f"{b.name}.keys", TensorType(b.type.dtype, (*b.type.shape[:2], b.type.shape[3], b.type.shape[2])))
    if t is not None and single(b) and t.inputs[0] is not None:
        perm = list(t.attrs["perm"])
        perm[2], perm[3] = perm[3], perm[2]
        removed.add(t)
        if perm == [0, 1, 2, 3]:  # B was K transposed: read K itself
            return t.inputs[0]
        new.append(Node("transpose", [t.inputs[0]], [k], {"perm": perm}, t.name))
    else:
        new.append(Node("transpose", [b], [k], {"perm": [0, 1, 3, 2]}, f"{b.name}/keys"))
    return k


def _mask_ok(m: Value, scores: TensorType) -> bool:
    t = m.type
    if t.dtype != scores.dtype or t.rank < 1 or t.rank > 4 or t.shape[-1] != scores.shape[-1]:
        return False
    tail = scores.shape[4 - t.rank:]
    return all(d == e or d == 1 for d, e in zip(t.shape, tail))


def _shapes_ok(a: TensorType, b: TensorType, v: TensorType, s: TensorType) -> bool:
    if a.rank != 4 or b.rank != 4 or v.rank != 4 or a.dtype != b.dtype or a.dtype != v.dtype:
        return False
    return (a.shape[:2] == b.shape[:2] == v.shape[:2] == s.shape[:2] and a.shape[3] == b.shape[2]
            and b.shape[3] == v.shape[2])


def _split_scale(a: Value, b: Value, single: _Single, producer: _Producer
                 ) -> tuple[float, Value, Value, list[Node]] | None:
    """(c, Q, Kt, [the two muls]) when ``a = Q * c`` and ``b = Kt * c`` with one constant ``c``."""
    found: list[tuple[float, Value, Node]] = []
    for x in (a, b):
        m = producer(x, "mul")
        if m is None or not single(x):
            return None
        c = scalar_const(m.inputs[1])
        inner = m.inputs[0]
        if c is None:
            c, inner = scalar_const(m.inputs[0]), m.inputs[1]
        if c is None or inner is None or inner.type != x.type or c <= 0:
            return None
        found.append((c, inner, m))
    (ca, qa, ma), (cb, qb, mb) = found
    if ca != cb:
        return None
    return ca, qa, qb, [ma, mb]


__all__ = ["FuseAttention"]

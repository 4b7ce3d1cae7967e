"""Epilogue fusion: Conv/Gemm/MatMul followed by bias, activation and residual adds become one
``fused_conv`` / ``fused_gemm`` / ``fused_matmul`` node whose kernel applies the elementwise
tail to the product's output as soon as it is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of
from cuvil.ops.fused import EPILOGUE_BASES, FUSABLE_DTYPES, extra_kind
from cuvil.ops.registry import get
from cuvil.passes.base import GraphPass, register_pass
from cuvil.passes.fuse_elementwise import (
    build_region,
    drop_unused_constants,
    fusable,
    rebuild,
    use_counts,
)

_FUSED_FORM = {base: fused for fused, base in EPILOGUE_BASES.items()}
_EXACT_BIAS = frozenset({DType.f16, DType.bf16})  # rule 2


def _channel_bias(conv_out: Value, node: Node) -> np.ndarray | None:
    """The per-output-channel constant ``node`` (an ``add``) adds to ``conv_out``, as ``[M]``; else None."""
    if node.op != "add" or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    other = b if a is conv_out else a if b is conv_out else None
    if other is None or other is conv_out:
        return None
    c = const_of(other)
    shape = conv_out.type.shape
    if c is None or c.ndim > len(shape) or not isinstance(shape[1], int):
        return None
    full = (1,) * (len(shape) - c.ndim) + c.shape
    if full[1] != shape[1] or any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return c.reshape(shape[1])


def _bias_sum(conv: Node, add: np.ndarray) -> np.ndarray | None:
    """``conv``'s bias (constant or absent) plus ``add``, in its element type: summed in float64 and
    rounded once; None for f16/bf16 when that rounding changes the sum (rule 2)."""
    old = const_of(conv.inputs[2]) if len(conv.inputs) > 2 else None
    dtype = conv.outputs[0].type.dtype
    total = add.astype(np.float64) + (old.astype(np.float64) if old is not None else 0.0)
    rounded = total.astype(dtype.np)
    if dtype in _EXACT_BIAS and not np.array_equal(rounded.astype(np.float64), total):
        return None
    return rounded


@register_pass
@dataclass(frozen=True)
class FuseEpilogue(GraphPass):
    """Fuses the elementwise tail of ``conv``, ``gemm`` and ``matmul`` into them.

    1. An anchor is a ``conv``, ``gemm`` or ``matmul`` whose result is a float (f64, f32, f16,
       bf16; an f16/bf16 epilogue rounds each result to its type, as the unfused ops do).
    2. A ``conv`` whose result is read once, by an ``add`` of a constant that is per output
       channel (``[M, 1, 1]``, ``[1, M, 1, 1]``, ...), takes that constant into its bias (added
       in float64, rounded once) and the ``add`` goes; repeated while it applies.  For f16/bf16
       only when the sum is exact in that type: a bias rounded to 11 or 8 bits would move the
       result by far more than the rounding of the ``add`` it saves.
    3. Then, while the current result is read exactly once, is not a graph output, and its
       reader is an elementwise op (float values, see ``cuvil/ops/fused.py``) whose result has the
       anchor's type and whose other operands are each one element, the anchor's shape (a
       residual) or a vector along its last axis (a bias of ``[N]``), the reader joins the
       epilogue; at most ``max_ops`` of them.
    4. With a non-empty epilogue, the anchor and the readers become one fused node (the base
       op's attributes plus the ``epilogue`` region), placed where the last reader was, giving
       the last reader's output value (its name stays); its operands are the anchor's, then the
       other operands of the readers in order of first reading.
    5. Regions of control-flow nodes are fused on their own.
    6. A reader joins at most one epilogue: of two products added together (``conv(x) + conv(x)``)
       the first in schedule order takes the ``add``, and the other stays a plain product that the
       fused node reads as its residual.
    """

    name: ClassVar[str] = "fuse-epilogue"
    max_ops: int = 16

    def run_on(self, g: Graph) -> bool:
        changed = False
        replaced: dict[Node, list[Node]] = {}
        removed: set[Node] = set()
        claimed: set[Node] = set()  # readers already in an epilogue: two anchors never share one (rule 6)
        consts: list[Value] = []
        counts = use_counts(g)
        users = g.users()
        for anchor in list(g.nodes):
            if anchor.op not in _FUSED_FORM or anchor in removed or anchor.outputs[0].type.dtype not in FUSABLE_DTYPES:
                continue
            acc = anchor.outputs[0]

            def sole_reader(v: Value) -> Node | None:
                us = users.get(v, [])
                ok = counts.get(v, 0) == 1 and len(us) == 1 and us[0] not in removed and us[0] not in claimed
                return us[0] if ok else None

            if anchor.op == "conv" and (len(anchor.inputs) < 3 or anchor.inputs[2] is None
                                        or const_of(anchor.inputs[2]) is not None):
                while (u := sole_reader(acc)) is not None and (bias := _channel_bias(acc, u)) is not None \
                        and u.outputs[0].type == acc.type and (total := _bias_sum(anchor, bias)) is not None:
                    consts.extend(v for v in [*u.inputs, *anchor.inputs[2:3]] if v is not None and v is not acc)
                    self._take_bias(anchor, total, replaced)
                    out = u.outputs[0]
                    anchor.outputs = [out]
                    out.producer = anchor
                    removed.add(u)
                    acc = out
                    changed = True
            chain: list[Node] = []
            cur = acc
            while len(chain) < self.max_ops:
                u = sole_reader(cur)
                if u is None or not fusable(u) or u.outputs[0].type != acc.type:
                    break
                if sum(1 for v in u.inputs if v is cur) != 1:
                    break
                others = [v for v in u.inputs if v is not None and v is not cur]
                if any(extra_kind(acc.type.shape, v.type.shape) is None for v in others):
                    break
                chain.append(u)
                cur = u.outputs[0]
            if not chain:
                continue
            region, extras = build_region("epilogue", g, chain, cur, seeds=[acc])
            n_base = len(get(anchor.op).inputs)
            base_ins = list(anchor.inputs) + [None] * (n_base - len(anchor.inputs))
            attrs = {**anchor.attrs, "epilogue": region}
            fused = Node(_FUSED_FORM[anchor.op], [*base_ins, *extras], [cur], attrs, anchor.name)
            before = replaced.pop(anchor, [])  # a new bias constant goes where the anchor was
            if before:
                replaced[anchor] = [n for n in before if n is not anchor]
            else:
                removed.add(anchor)
            removed.update(chain[:-1])
            claimed.update(chain)
            replaced[chain[-1]] = [fused]
            changed = True
        if not changed:
            return False
        rebuild(g, replaced, removed - set(replaced))
        drop_unused_constants(g, consts)
        return True

    @staticmethod
    def _take_bias(conv: Node, total: np.ndarray, replaced: dict[Node, list[Node]]) -> None:
        """Give ``conv`` the bias ``total`` (a new constant placed just before it)."""
        m = total.shape[0]
        dtype = conv.outputs[0].type.dtype
        value = Value(f"{conv.name or 'conv'}_bias", TensorType(dtype, (m,)))
        Node("constant", [], [value], {"value": total})
        assert value.producer is not None
        ins = list(conv.inputs) + [None] * (3 - len(conv.inputs))
        ins[2] = value
        conv.inputs = ins
        replaced[conv] = [value.producer, conv]

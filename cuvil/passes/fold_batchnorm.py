"""Batch-norm folding: an inference-mode ``batch_norm`` after a ``conv``, ``gemm`` or ``matmul``
with constant weights becomes part of those weights and a bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil import faults
from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of
from cuvil.ops.registry import get
from cuvil.passes.base import GraphPass, register_pass
from cuvil.passes.fuse_elementwise import drop_unused_constants, rebuild, use_counts


def _constant(name: str, value: np.ndarray) -> Node:
    out = Value(name, TensorType(DType.from_np(value.dtype), value.shape))
    return Node("constant", [], [out], {"value": value})


@register_pass
@dataclass(frozen=True)
class FoldBatchNorm(GraphPass):
    """Folds ``batch_norm`` into the ``conv``, ``gemm`` or ``matmul`` that produces its input.

    With ``s = scale / sqrt(var + epsilon)`` per channel (channel = axis 1 of the product's result):

    1. The batch norm's scale, B, mean and var are constants of shape ``[C]`` (per channel),
       its input is read only by it and is not a graph output, and the element type is a float.
    2. ``conv`` with a constant weight ``W`` and a constant or absent bias ``b``: ``W[m] *= s[m]``
       (output channel ``m``, groups included) and the bias becomes ``(b - mean) * s + B``.
    3. ``gemm`` with a constant ``B`` operand and a constant or absent ``C``: the columns of
       ``op(B)`` are scaled by ``s`` and ``C`` becomes ``(beta * C - mean) * s + B`` (``beta = 1``);
       ``alpha`` is kept.
    4. ``matmul`` of a 2-D result with a constant 2-D ``B``: it becomes a ``gemm`` with the
       scaled ``B`` and ``C = B_bn - mean * s``.
    5. Everything is computed in float64 from the stored values and rounded once to the element
       type; the folded node gives the batch norm's output value (its name stays), and constants
       nothing reads any more are removed.
    """

    name: ClassVar[str] = "fold-batchnorm"

    def run_on(self, g: Graph) -> bool:
        counts = use_counts(g)
        here = set(g.nodes)
        replaced: dict[Node, list[Node]] = {}
        removed: set[Node] = set()
        stale: list[Value] = []
        for bn in g.nodes:
            if bn.op != "batch_norm" or bn.outputs[0].type.dtype not in FLOATS:
                continue
            x = bn.inputs[0]
            p = x.producer if x is not None else None
            if x is None or p is None or p not in here or p in replaced or counts.get(x, 0) != 1:
                continue
            params = [const_of(v) for v in bn.inputs[1:5]]
            channels = x.type.shape[1] if x.type.rank >= 2 else None
            if not isinstance(channels, int) or any(c is None or c.shape != (channels,) for c in params):
                continue
            scale, shift, mean, var = (np.asarray(c, np.float64) for c in params)
            eps = float(get("batch_norm").fill_attrs(bn.attrs)["epsilon"])
            if faults.active("bn-epsilon", self.faults):  # the planted bug: folding with the wrong epsilon
                eps = eps * 10 + 1e-3
            s = scale / np.sqrt(var + eps)
            new = self._fold(p, s, shift - mean * s)
            if new is None:
                continue
            consts, node = new
            stale.extend(v for v in [*p.inputs, *bn.inputs[1:]] if v is not None)
            out = bn.outputs[0]
            node.outputs = [out]
            out.producer = node
            replaced[p] = [*consts, node]
            removed.add(bn)
        if not replaced:
            return False
        rebuild(g, replaced, removed)
        drop_unused_constants(g, stale)
        return True

    @staticmethod
    def _fold(p: Node, s: np.ndarray, offset: np.ndarray) -> tuple[list[Node], Node] | None:
        """The constants and the node replacing ``p`` followed by the batch norm, or None.

        ``offset = B - mean * s`` is the bias of a product without one; a bias ``b`` of its own
        becomes ``(b - mean) * s + B = b * s + offset``."""
        dt = p.outputs[0].type.dtype.np
        name = p.name or p.op
        if p.op == "conv":
            w = const_of(p.inputs[1])
            b = const_of(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] is not None else None
            if w is None or (len(p.inputs) > 2 and p.inputs[2] is not None and b is None):
                return None
            w2 = w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))
            b2 = offset if b is None else b.astype(np.float64) * s + offset
            cw, cb = _constant(f"{name}_w", w2.astype(dt)), _constant(f"{name}_b", b2.astype(dt))
            node = Node("conv", [p.inputs[0], cw.outputs[0], cb.outputs[0]], [], p.attrs, p.name)
            return [cw, cb], node
        if p.op == "gemm":
            a = get("gemm").fill_attrs(p.attrs)
            bmat = const_of(p.inputs[1])
            c = const_of(p.inputs[2]) if len(p.inputs) > 2 and p.inputs[2] is not None else None
            if bmat is None or (len(p.inputs) > 2 and p.inputs[2] is not None and c is None):
                return None
            b2 = bmat.astype(np.float64) * (s.reshape(-1, 1) if a["transB"] else s.reshape(1, -1))
            c2 = offset if c is None else (float(a["beta"]) * c.astype(np.float64)) * s + offset
            cb, cc = _constant(f"{name}_b", b2.astype(dt)), _constant(f"{name}_c", c2.astype(dt))
            node = Node("gemm", [p.inputs[0], cb.outputs[0], cc.outputs[0]], [], {**a, "beta": 1.0}, p.name)
            return [cb, cc], node
        if p.op == "matmul":
            bmat = const_of(p.inputs[1])
            a_in = p.inputs[0]
            if bmat is None or bmat.ndim != 2 or p.outputs[0].type.rank != 2 or a_in is None or a_in.type.rank != 2:
                return None
            b2 = bmat.astype(np.float64) * s.reshape(1, -1)
            cb, cc = _constant(f"{name}_b", b2.astype(dt)), _constant(f"{name}_c", offset.astype(dt))
            node = Node("gemm", [a_in, cb.outputs[0], cc.outputs[0]], [], get("gemm").fill_attrs({}), p.name)
            return [cb, cc], node
        return None

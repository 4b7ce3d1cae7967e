"""Layout conversion: 2-D convolutions run channels-last (``conv_nhwc``), with the layout changes
placed by the pass at the edges of channels-last regions only.

The pass walks each graph once, in order, keeping for every NCHW value that has one its NHWC
twin.  A converted convolution reads the twin of its input (a ``transpose`` is made the first
time a value needs one) and defines only the twin of its output; the NCHW value is then made
from the twin (by the inverse ``transpose``) only when, and where, something first reads it in
NCHW.  Layout-agnostic ops between convolutions (elementwise ops: bias adds, activations,
residual adds, the clamp of ReLU6; ``concat`` along the channels) run on the twins, so a chain
conv -> relu -> conv -> add -> ... holds no transpose at all: the layout changes that would cancel
are never made.  Weights are transposed here, once, into the layout the C kernel reads
(``[KH, KW, C/group, M]``, the GEMM's ``[K, M]`` operand as it lies); the kernel's GEMM packs
them once per model.

Why before fusion (the default pipeline runs ``convert-layout`` after ``fold-batchnorm`` and
before ``fuse-epilogue``): batch norms must already be folded into the convolutions (a batch
norm is not layout-agnostic), and fusion then sees the NHWC graph as it is: a ``conv_nhwc``
with its channels-last bias / activation / residual tail becomes a ``fused_conv_nhwc`` whose
epilogue runs on each finished GEMM tile, where a per-channel operand is a vector along the
last axis (the ``row`` operand of an epilogue, ``cuvil/ops/fused.py``).  Fusion never has to
reason about layouts, and no transpose is ever caught inside a fused region.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value, captures, reads
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of, normalize_axis
from cuvil.ops.layout import TO_NCHW, TO_NHWC, WEIGHT_TO_HWIO, permute
from cuvil.ops.registry import ELEMENTWISE, lookup
from cuvil.passes.base import Pass, PassResult, register_pass
from cuvil.passes.fuse_elementwise import drop_unused_constants, nested_graphs
from cuvil.passes.rewrite import can_replace, defined_by_nodes, replace_value, resolve_inputs

LAYOUTS = ("nhwc",)
CONV_DTYPES = (DType.f32, DType.f16, DType.bf16)  # what the channels-last kernels run
POLICIES = ("all", "auto")


@register_pass
@dataclass(frozen=True)
class ConvertLayout(Pass):
    """Runs 2-D convolutions in NHWC; layout changes only where NHWC and NCHW regions meet.

    1. A candidate is a ``conv`` with a float32, float16 or bfloat16 ``[N, C, H, W]`` input, a
       constant weight, and a 1-D bias or none.  With ``convs=all`` every candidate converts.  With ``convs=auto``
       (the default) a graph's candidates convert together, or none does: all of them when
       more of their multiply-adds are in convolutions the channels-last kernels serve best
       (depthwise, 1x1, strided, grouped, kernels other than 3x3) than in dense unit-stride
       3x3 convolutions, which NCHW runs by Winograd with fewer multiply-adds.  Converting
       every one (not a per-node choice) keeps the layout changes at the graph's edges; dims
       known only at run time count as 1.
    2. A converted candidate becomes ``conv_nhwc`` on the NHWC twin of its input, with its
       weight transposed to ``[KH, KW, C/group, M]`` as a new constant; it defines the twin of
       its output.
    3. An elementwise op with a rank-4 result converts when one of its operands has a twin and
       every other operand is a constant (transposed to match, after its rank is padded to 4
       the way broadcasting pads it), has only dims of 1, or, for at most one operand, is a
       rank-4 value that gets a twin by one new transpose.  ``concat`` of rank-4 values that
       all have twins converts with its axis remapped.  A converted op defines the twin of its
       output.
    4. A value's twin is ``transpose(v, [0, 2, 3, 1])``, made once, before the first node that
       needs it, except for a value that is itself ``transpose(x, [0, 3, 1, 2])`` of a rank-4 ``x``
       (an NHWC model's convolution input as tf2onnx writes it): its twin is ``x``, and the
       transpose is dropped when nothing reads it any more; likewise ``transpose(v, [0, 2, 3, 1])``
       of a value with a twin (tf2onnx's way back to NHWC after a convolution) is that twin: its
       readers read the twin (a graph output takes the twin's place and keeps its name), unless a
       region reads it.  A value known only by its twin gets its NCHW form back,
       ``transpose(twin, [0, 3, 1, 2])`` under its own name, right before the first node that
       reads it in NCHW (a region capture counts) or at the end for a graph output.  Graph
       inputs and outputs keep their layout, names and types.
    5. Each region of a control-flow node is converted on its own; values it reads from
       enclosing graphs are NCHW there.
    """

    name: ClassVar[str] = "convert-layout"
    layout: str = "nhwc"
    convs: str = "auto"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r} (known: {', '.join(LAYOUTS)})")
        if self.convs not in POLICIES:
            raise ValueError(f"convs={self.convs!r} is not one of {', '.join(POLICIES)}")

    def run(self, graph: Graph) -> PassResult:
        names = {v.name for n in graph.walk() for v in [*n.inputs, *n.outputs] if v is not None}
        names.update(v.name for v in graph.inputs)
        changed = False
        for g in nested_graphs(graph):
            changed |= _Rewriter(g, names, self.convs).run()
        return PassResult(graph, changed)


def _perm(perm: object) -> tuple[int, ...] | None:
    """A rank-4 transpose's permutation as a tuple (None: absent, or not four axes)."""
    if not isinstance(perm, list | tuple | np.ndarray) or len(perm) != 4:
        return None
    return tuple(int(p) % 4 for p in perm)


def _is_candidate(node: Node) -> bool:
    """Rule 1."""
    if node.op != "conv" or len(node.outputs) != 1:
        return False
    x, w = node.inputs[0], node.inputs[1]
    b = node.inputs[2] if len(node.inputs) > 2 else None
    if x is None or w is None or x.type.rank != 4 or x.type.dtype not in CONV_DTYPES or const_of(w) is None:
        return False
    return b is None or b.type.rank == 1


def _macs(node: Node) -> int:
    """Multiply-adds of a candidate (run-time dims count as 1)."""
    w, y = node.inputs[1], node.outputs[0]
    assert w is not None
    dims = [*y.type.shape, *w.type.shape[1:]]
    return int(np.prod([d if isinstance(d, int) else 1 for d in dims], dtype=np.int64))


def _prefers_nchw(node: Node) -> bool:
    """A dense unit-stride 3x3 convolution: Winograd's, in NCHW."""
    a = node.attrs
    w = node.inputs[1]
    assert w is not None
    return (int(a.get("group", 1)) == 1 and tuple(w.type.shape[2:]) == (3, 3)
            and all(int(s) == 1 for s in a.get("strides") or (1, 1))
            and all(int(d) == 1 for d in a.get("dilations") or (1, 1)))


def _worth_converting(graph: Graph, policy: str) -> bool:
    """Rule 1's choice for ``graph`` (its own nodes; each region chooses for itself)."""
    candidates = [n for n in graph.nodes if _is_candidate(n)]
    if policy == "all" or not candidates:
        return True
    nchw = sum(_macs(n) for n in candidates if _prefers_nchw(n))
    return sum(_macs(n) for n in candidates) - nchw > nchw


class _Rewriter:
    """One graph's conversion (rules 2-4)."""

    def __init__(self, graph: Graph, names: set[str], policy: str) -> None:
        self.g = graph
        self.names = names
        self.convert = _worth_converting(graph, policy)
        self.twin: dict[Value, Value] = {}  # NCHW value (or constant) -> its NHWC twin
        self.lazy: set[Value] = set()  # NCHW values that, so far, only their twin defines
        self.out: list[Node] = []
        self.dropped: list[Value] = []  # operands of replaced nodes: constants that may be dead now
        self.bypassed: list[Node] = []  # transposes to NCHW whose input became their output's twin
        self.subst: dict[Value, Value] = {}  # transposes back to NHWC of a value with a twin -> the twin

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def run(self) -> bool:
        changed = False
        captured = {v for n in self.g.nodes for v in captures(n)}
        for node in self.g.nodes:
            if self.is_inverse(node) and node.outputs[0] not in captured:
                self.subst[node.outputs[0]] = self.twin[node.inputs[0]]  # type: ignore[index]
                changed = True
            elif self.convert and _is_candidate(node):
                self.convert_conv(node)
                changed = True
            elif self.convert_agnostic(node):
                changed = True
            else:
                self.need_nchw(reads(node))
                self.out.append(node)
        self.need_nchw(self.g.outputs)
        if not changed:
            return False
        self.g.nodes = self.out
        if self.subst:
            self.cancel_inverses()
        if self.bypassed:
            read = {v for n in self.g.nodes for v in reads(n)} | set(self.g.outputs)
            dead = {id(n) for n in self.bypassed if not any(o in read for o in n.outputs)}
            self.g.nodes = [n for n in self.g.nodes if id(n) not in dead]
        drop_unused_constants(self.g, self.dropped)
        return True

    def is_inverse(self, node: Node) -> bool:
        """``transpose(v, [0, 2, 3, 1])`` of a value ``v`` that has a twin (rule 4)."""
        x = node.inputs[0] if node.op == "transpose" and node.inputs else None
        return (x is not None and x in self.twin and x.type.rank == 4 and len(node.outputs) == 1
                and _perm(node.attrs.get("perm")) == TO_NHWC and self.twin[x].type == node.outputs[0].type)

    def cancel_inverses(self) -> None:
        """Readers of the cancelled transposes read the twins; a graph output takes its twin's place
        and name, or, where the twin cannot (a graph input, or an output already), is an identity of it."""
        local = defined_by_nodes(self.g)
        for old, new in list(self.subst.items()):
            if old in self.g.outputs and not can_replace(self.g, old, new, local):
                del self.subst[old]
                self.g.nodes.append(Node("identity", [new], [old], {}, old.name))
            elif old in self.g.outputs:
                replace_value(self.g, old, new, self.subst)
        for n in self.g.nodes:
            resolve_inputs(n, self.subst)

    # -- the two layouts of a value ---------------------------------------------------------------

    def to_nhwc(self, v: Value) -> Value:
        """``v``'s twin, made by a transpose (or, for a constant, a transposed constant) if needed."""
        if v in self.twin:
            return self.twin[v]
        p = v.producer
        if (p is not None and p.op == "transpose" and p.inputs and p.inputs[0] is not None
                and p.inputs[0].type.rank == 4 and _perm(p.attrs.get("perm")) == TO_NCHW):
            self.twin[v] = p.inputs[0]  # rule 4: transpose(transpose(x, to NCHW), to NHWC) is x
            self.bypassed.append(p)
            return p.inputs[0]
        c = const_of(v)
        if c is not None:
            padded = c.reshape((1,) * (4 - c.ndim) + c.shape)
            t = Value(self.fresh(f"{v.name}_nhwc"), TensorType(v.type.dtype, tuple(padded.shape[p] for p in TO_NHWC)))
            self.out.append(Node("constant", [], [t], {"value": np.ascontiguousarray(padded.transpose(TO_NHWC))},
                                 t.name))
            self.dropped.append(v)
        else:
            t = Value(self.fresh(f"{v.name}_nhwc"), permute(v.type, TO_NHWC))
            self.out.append(Node("transpose", [v], [t], {"perm": list(TO_NHWC)}, t.name))
        self.twin[v] = t
        return t

    def need_nchw(self, values: Iterable[Value]) -> None:
        """Give each value in ``values`` that only its twin defines its NCHW form (rule 4)."""
        for v in sorted((v for v in values if v in self.lazy), key=lambda v: v.name):
            self.lazy.discard(v)
            self.out.append(Node("transpose", [self.twin[v]], [v], {"perm": list(TO_NCHW)}, v.name))

    def define_twin(self, old: Value) -> Value:
        """A new value for the twin of ``old``, whose own producer is being replaced."""
        t = Value(self.fresh(f"{old.name}_nhwc"), permute(old.type, TO_NHWC))
        self.twin[old] = t
        self.lazy.add(old)
        old.producer = None
        return t

    # -- rules 2 and 3 ----------------------------------------------------------------------------

    def convert_conv(self, node: Node) -> None:
        x, w = node.inputs[0], node.inputs[1]
        assert x is not None and w is not None
        weight = const_of(w)
        assert weight is not None
        xt = self.to_nhwc(x)
        wt = Value(self.fresh(f"{w.name}_hwio"), permute(w.type, WEIGHT_TO_HWIO))
        self.out.append(Node("constant", [], [wt], {"value": np.ascontiguousarray(weight.transpose(WEIGHT_TO_HWIO))},
                             wt.name))
        self.dropped.append(w)
        yt = self.define_twin(node.outputs[0])
        self.out.append(Node("conv_nhwc", [xt, wt, *node.inputs[2:3]], [yt], dict(node.attrs), node.name))

    def convert_agnostic(self, node: Node) -> bool:
        if len(node.outputs) != 1 or node.outputs[0].type.rank != 4 or any(True for _ in node.regions()):
            return False
        ins = node.inputs
        if not any(v in self.twin and v.type.rank == 4 and const_of(v) is None for v in ins if v is not None):
            return False
        if node.op == "concat":
            if any(v is None or v.type.rank != 4 or v not in self.twin for v in ins):
                return False
            axis = normalize_axis("concat", int(node.attrs.get("axis", 0)), 4)
            attrs = {**node.attrs, "axis": TO_NHWC.index(axis)}
        else:
            opdef = lookup(node.op)
            if opdef is None or ELEMENTWISE not in opdef.traits:
                return False
            fresh = [v for v in ins if v is not None and v not in self.twin and const_of(v) is None
                     and not all(d == 1 for d in v.type.shape)]
            if len(fresh) > 1 or any(v.type.rank != 4 for v in fresh):
                return False
            attrs = dict(node.attrs)
        new_ins: list[Value | None] = []
        for v in ins:
            if v is None or (v not in self.twin and all(d == 1 for d in v.type.shape)):
                new_ins.append(v)  # absent, or one element: the same in every layout
            else:
                new_ins.append(self.to_nhwc(v))
        yt = self.define_twin(node.outputs[0])
        self.out.append(Node(node.op, new_ins, [yt], attrs, node.name))
        return True

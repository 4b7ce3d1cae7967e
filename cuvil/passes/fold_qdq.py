"""QDQ folding: a float conv/matmul/gemm between dequantize and quantize nodes becomes one integer kernel
(and, for int8 PTQ, a float32 matmul/gemm of dequantized operands: :func:`fold_float_products`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.types import TensorType
from cuvil.ops.common import const_of
from cuvil.ops.registry import RefCtx, get
from cuvil.passes.base import Pass, PassResult, register_pass
from cuvil.passes.fuse_elementwise import nested_graphs, rebuild, use_counts

_log = logging.getLogger(__name__)
_BYTES = (DType.i8, DType.u8)
#: The most a float bias's rounding to int32 may move a value, in output quantization steps (rule 3).
FLOAT_BIAS_STEPS = 1.0 / 64


class _UnfoldableError(Exception):
    """Why one pattern is left as explicit quantize/dequantize nodes (logged at DEBUG)."""


@dataclass
class _Dq:
    """A ``dequantize_linear`` node read as (quantized value, scale, zero point)."""

    node: Node
    q: Value
    scale: np.ndarray | None
    zp: np.ndarray | None
    axis: int | None  # None: per-tensor


def _dq(v: Value | None, what: str) -> _Dq:
    n = v.producer if v is not None else None
    if v is None or n is None or n.op != "dequantize_linear":
        raise _UnfoldableError(f"{what} is not the output of a dequantize_linear")
    q = n.inputs[0]
    assert q is not None
    scale = const_of(n.inputs[1])
    zp = const_of(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] is not None else None
    if scale is None or (len(n.inputs) > 2 and n.inputs[2] is not None and zp is None):
        raise _UnfoldableError(f"the scale or zero point of {what} is not a constant")
    if int(n.attrs.get("block_size") or 0) != 0 and scale.size > 1:
        raise _UnfoldableError(f"{what} is block-quantized")
    axis = None if scale.size == 1 else int(n.attrs.get("axis", 1)) % q.type.rank
    return _Dq(n, q, scale, zp, axis)


class _Names:
    """Fresh value names for one graph."""

    def __init__(self, g: Graph) -> None:
        self.taken = {v.name for v in g.inputs} | {o.name for n in g.nodes for o in n.outputs}

    def __call__(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.taken:
            name, i = f"{hint}_{i}", i + 1
        self.taken.add(name)
        return name


@register_pass
@dataclass(frozen=True)
class FoldQDQ(Pass):
    """Folds ``dequantize_linear -> conv|matmul|gemm [-> relu|clip] -> quantize_linear`` into
    ``qlinear_conv`` / ``qlinear_matmul``, ``dequantize_linear -> max_pool -> quantize_linear``
    into an 8-bit ``max_pool`` and two dequantizes into ``add [-> relu] -> quantize_linear`` into
    ``qlinear_add``, and dequantizes the constant weights left over.

    1. The quantize node's input is produced by ``conv``, ``matmul`` or ``gemm`` (optionally
       through a ``relu`` or a ``clip`` as in rule 8), each intermediate read only there and not
       a graph output.
    2. The product's data input is a per-tensor ``dequantize_linear`` of int8/uint8; its weight
       a ``dequantize_linear`` of a constant int8/uint8 tensor, per-tensor or per output channel
       (conv: axis 0; matmul: the columns, axis 1; gemm: axis 0 with ``transB``, else 1);
       every scale and zero point is a constant, and the three scales share one element type.
       The output quantization is per-tensor to int8/uint8.
    3. A bias (conv's ``B``, gemm's ``C``, 1-D) must be a ``dequantize_linear`` of a constant
       int32 tensor with zero point 0 whose scale equals ``x_scale * w_scale`` (computed in the
       scales' type) exactly: it is then added in int32, as the integer kernel does.  A constant
       float bias (PyTorch's PT2E flow leaves biases float) becomes int32 at that scale, rounded
       half to even, as PyTorch's quantized CPU kernels run it, when it fits in 2^30 and the
       rounding moves no value by more than 1/64 of an output step (:data:`FLOAT_BIAS_STEPS`);
       the folds that did so are logged at INFO with the largest move.  The result then differs
       from the float graph's by one step at most, and only where the float value lies within
       that move of a rounding boundary.
    4. gemm needs ``alpha = beta = 1`` and no ``transA``; a ``transB`` weight is transposed at
       compile time.  matmul needs a 2-D weight, dequantized or the 2-D transpose of a
       dequantized one (then quantized along axis 0 and transposed at compile time, as ``transB``).
    5. Scales and zero points are kept exactly as given (a missing zero point becomes a zero
       constant); a ``relu`` becomes ``relu=1`` (clamping at the output zero point, which is
       exactly quantizing the relu's result).  The fused node defines the quantize node's value.
    6. A pattern that fails a rule stays as it is (correct, only slower), and the reason is
       logged at DEBUG.  Afterwards, every ``dequantize_linear`` of constants that is still
       read becomes a float constant (the weights of the float kernels); the nodes and
       constants the folds left unread are removed.
    7. ``dequantize_linear -> max_pool -> quantize_linear`` (per-tensor, one 8-bit type in and out,
       the pool's result read only there) becomes ``max_pool`` on the quantized tensor when the
       input scale is positive and finite and quantizing the dequantization of every value of the
       type gives it back (checked on all 256 with the reference): the dequantization is then
       nondecreasing, so it commutes with max, and the pair is the identity.  A window of padding
       alone gives the type's lowest value either way (-inf saturates to it).
    8. A ``clip`` with constant (or absent) bounds ``lo``, ``hi`` (not NaN) before the quantize
       folds when its bounds are checked in the integer domain: quantization is nondecreasing, so
       ``quantize(clip(v, lo, hi)) = min(max(quantize(v), quantize(lo)), quantize(hi))``.  That
       is the kernel's own saturation when ``quantize(lo)`` is the type's lowest value (else the
       output zero point: ``relu=1``) and ``quantize(hi)`` its highest; other bounds stay
       explicit.  ReLU6 into a tensor calibrated on the ReLU6's output is such a clip.
    9. ``quantize_linear(add(dequantize_linear(a), dequantize_linear(b)) [-> relu])`` becomes
       ``qlinear_add`` (exactly the same float32 arithmetic, ``cuvil/ops/qlinear.py`` rule 4) when
       ``a``, ``b`` and the result are per-tensor 8-bit tensors of one static shape, every scale is
       a float32 constant, the dequantizes give float32, the quantize divides in float32, and the
       sum (and the relu's result) is read only there and is not a graph output.

    The pass preserves the graph's values exactly wherever the quantize after the product absorbs
    the rounding, float biases (rule 3) aside.  :func:`fold_float_products` (used by int8 PTQ, not
    by this pass) also folds a product whose result stays float32, which changes the rounding of
    that result.
    """

    name: ClassVar[str] = "fold-qdq"

    def run(self, graph: Graph) -> PassResult:
        changed = False
        for g in nested_graphs(graph):
            changed |= _fold_graph(g)
        return PassResult(graph, changed)


def _fold_graph(g: Graph) -> bool:
    counts = use_counts(g)
    names = _Names(g)
    replaced: dict[Node, list[Node]] = {}
    removed: set[Node] = set()
    stale: list[Value] = []
    moves: dict[str, float] = {}  # product -> how far its float bias's rounding moves a value (output steps)
    for q in g.nodes:
        if q.op != "quantize_linear" or not (_is_product_tail(q) or _is_pool_tail(q) or _is_add_tail(q)):
            continue
        try:
            if _is_pool_tail(q):
                new, gone = _fold_pool(g, q, counts)
            elif _is_add_tail(q) and not _is_product_tail(q):
                new, gone = _fold_add(g, q, counts, names)
            else:
                new, gone = _fold(g, q, counts, names, moves)
        except _UnfoldableError as why:
            _log.debug("fold-qdq: %r (%s) stays explicit: %s", q.name, q.op, why)
            continue
        if any(n in removed or n in replaced for n in gone):
            moves.pop(q.name, None)
            continue
        replaced[q] = new
        removed.update(gone)
        stale.extend(v for n in (q, *gone) for v in n.inputs if v is not None)
    if replaced:
        rebuild(g, replaced, removed)
    if moves:
        worst = max(moves, key=lambda k: moves[k])
        _log.info("fold-qdq: %d integer products took their float bias as int32 at x_scale * w_scale (rounded as "
                  "PyTorch's quantized kernels do); that moves a value by %.2g output steps at most (%r)",
                  len(moves), moves[worst], worst)
    folded = _dequantize_constants(g)
    stale.extend(v for n in folded for v in n.inputs if v is not None)
    _drop_dead(g, stale)
    return bool(replaced or folded)


def _through(q: Node, activations: tuple[str, ...]) -> Node | None:
    """The producer of ``q``'s input, looking through one node of ``activations``."""
    p = q.inputs[0].producer if q.inputs[0] is not None else None
    if p is not None and p.op in activations and p.inputs[0] is not None:
        p = p.inputs[0].producer
    return p


def _is_product_tail(q: Node) -> bool:
    p = _through(q, ("relu", "clip"))
    return p is not None and (p.op in ("conv", "matmul", "gemm") or _biased_product(p) is not None)


def _biased_product(add: Node) -> tuple[Node, Value] | None:
    """For an ``add`` of a matmul's (or gemm's) result and a constant: the product and the constant
    (``nn.Linear`` on more than two dims, from ``torch.export``, adds its bias after the matmul)."""
    if add.op != "add" or len(add.inputs) != 2:
        return None
    for a, c in (add.inputs, add.inputs[::-1]):
        if (a is not None and c is not None and a.producer is not None and a.producer.op in ("matmul", "gemm")
                and const_of(c) is not None):
            return a.producer, c
    return None


def _is_add_tail(q: Node) -> bool:
    p = _through(q, ("relu",))
    return p is not None and p.op == "add"


def _output_params(q: Node) -> tuple[np.ndarray, np.ndarray | None]:
    """The constant per-tensor scale and zero point (None: absent) of quantize node ``q``."""
    ys, yzp = const_of(q.inputs[1]), const_of(q.inputs[2]) if len(q.inputs) > 2 and q.inputs[2] is not None else None
    if ys is None or ys.size != 1 or (len(q.inputs) > 2 and q.inputs[2] is not None and (yzp is None or yzp.size != 1)):
        raise _UnfoldableError("the output quantization is not per-tensor with constant parameters")
    if q.outputs[0].type.dtype not in _BYTES:
        raise _UnfoldableError(f"the output is quantized to {q.outputs[0].type.dtype}, not int8/uint8")
    return ys, yzp


def _clip_relu(q: Node, clip: Node) -> bool:
    """Rule 8: whether the clip before ``q`` is the kernel's saturation alone (False) or with the
    clamp at the zero point (True); raises when it is neither."""
    bounds = []
    for i, far in ((1, -np.inf), (2, np.inf)):
        v = clip.inputs[i] if len(clip.inputs) > i else None
        c = const_of(v) if v is not None else np.array(far, np.float32)
        if c is None or c.size != 1 or np.isnan(c).any():
            raise _UnfoldableError("the clip's bounds are not constant numbers")
        bounds.append(c.reshape(()))
    x = clip.outputs[0]
    args = [const_of(i) if i is not None else None for i in q.inputs]
    qlo, qhi = _apply(q, [np.array(bounds, x.type.dtype.np), *args[1:]], q.outputs[0])
    tlo, thi = np.iinfo(q.outputs[0].type.dtype.np).min, np.iinfo(q.outputs[0].type.dtype.np).max
    zp = int(args[2].reshape(-1)[0]) if len(args) > 2 and args[2] is not None else 0
    if int(qhi) != thi or int(qlo) not in (tlo, zp):
        raise _UnfoldableError(f"the clip's bounds quantize to [{int(qlo)}, {int(qhi)}], neither saturation "
                               "nor the zero point")
    return int(qlo) != tlo


def _is_pool_tail(q: Node) -> bool:
    p = q.inputs[0].producer if q.inputs[0] is not None else None
    return p is not None and p.op == "max_pool" and len(p.outputs) == 1


def _fold_pool(g: Graph, q: Node, counts: dict[Value, int]) -> tuple[list[Node], set[Node]]:
    """Rule 7: ``quantize(max_pool(dequantize(x)))`` is ``max_pool(x)`` when ``quantize(dequantize(v)) == v``
    for every value ``v`` of x's type (checked on all of them) and the scale is positive."""
    v = q.inputs[0]
    assert v is not None and v.producer is not None
    p = v.producer
    _single_use(v, counts, g, "the max_pool's result")
    x = _dq(p.inputs[0], "the max_pool's input")
    dt = x.q.type.dtype
    if x.axis is not None or dt not in _BYTES or q.outputs[0].type.dtype is not dt:
        raise _UnfoldableError("the max_pool's input and output are not per-tensor quantized to one 8-bit type")
    assert x.scale is not None
    if not (np.isfinite(x.scale).all() and float(x.scale.reshape(-1)[0]) > 0):  # a nondecreasing dequantization
        raise _UnfoldableError("the input scale is not positive and finite")
    every = np.arange(*(np.iinfo(dt.np).min, np.iinfo(dt.np).max + 1)).astype(dt.np)
    deq = _apply(x.node, [every, *(const_of(i) for i in x.node.inputs[1:])], p.inputs[0])
    args = [const_of(i) if i is not None else None for i in q.inputs]
    if any(i is not None and a is None for i, a in zip(q.inputs[1:], args[1:])):
        raise _UnfoldableError("the output scale or zero point is not a constant")
    if not np.array_equal(_apply(q, [deq, *args[1:]], q.outputs[0]), every):
        raise _UnfoldableError("quantizing the dequantized values does not give them back")
    pool = Node("max_pool", [x.q], [q.outputs[0]], dict(p.attrs), q.name)
    q.outputs[0].producer = pool
    return [pool], {p}


def _apply(n: Node, args: list[np.ndarray | None], out: Value | None) -> np.ndarray:
    """``n``'s reference on ``args`` (its first input replaced by a 1-D array)."""
    assert out is not None
    opdef = get(n.op)
    assert opdef.reference is not None
    t = TensorType(out.type.dtype, (int(np.asarray(args[0]).size),))
    (y,) = opdef.reference(RefCtx(n.op, list(args), opdef.fill_attrs(n.attrs), [t]))
    return np.asarray(y)


def _single_use(v: Value, counts: dict[Value, int], g: Graph, what: str) -> None:
    if counts.get(v, 0) != 1 or v in g.outputs:
        raise _UnfoldableError(f"{what} is read elsewhere too")


def _fold(g: Graph, q: Node, counts: dict[Value, int], names: _Names,
          moves: dict[str, float]) -> tuple[list[Node], set[Node]]:
    """The nodes replacing ``q``, and the ones it makes unnecessary (rules 1 to 5)."""
    v = q.inputs[0]
    assert v is not None
    gone: set[Node] = set()
    ys, yzp = _output_params(q)
    out_dt = q.outputs[0].type.dtype
    act = v.producer if v.producer is not None and v.producer.op in ("relu", "clip") else None
    relu = act is not None and (act.op == "relu" or _clip_relu(q, act))
    if act is not None:
        _single_use(v, counts, g, f"the {act.op}'s result")
        gone.add(act)
        v = act.inputs[0]
        assert v is not None
    p = v.producer
    assert p is not None
    _single_use(v, counts, g, f"the {p.op}'s result")
    gone.add(p)
    added_bias: np.ndarray | None = None  # a float bias added after a matmul
    biased = _biased_product(p) if p.op == "add" else None
    if biased is not None:
        p, c = biased
        _single_use(p.outputs[0], counts, g, f"the {p.op}'s result")
        gone.add(p)
        added_bias = const_of(c)
        assert added_bias is not None
        if not c.type.dtype.is_float or added_bias.ndim < 1 or any(d != 1 for d in added_bias.shape[:-1]):
            raise _UnfoldableError("the constant added to the product is not a float bias along its columns")
        added_bias = added_bias.reshape(-1)
    x = _dq(p.inputs[0], "the data input")
    if x.axis is not None or x.q.type.dtype not in _BYTES:
        raise _UnfoldableError("the data input is not per-tensor int8/uint8")
    w, transposed = _weight_dq(p) if p.op != "conv" else (_dq(p.inputs[1], "the weight"), False)
    wq = const_of(w.q)
    if wq is None or w.q.type.dtype not in _BYTES:
        raise _UnfoldableError("the weight is not a constant int8/uint8 tensor")
    sdt = x.scale.dtype if x.scale is not None else None
    if w.scale is None or x.scale is None or not (w.scale.dtype == sdt == ys.dtype):
        raise _UnfoldableError("the scales do not share one element type")
    attrs: dict[str, object] = {"relu": int(relu)}
    bias_in = None
    trans_b = False
    if p.op == "conv":
        if w.axis not in (None, 0):
            raise _UnfoldableError(f"the weight is quantized along axis {w.axis}, not the output channels")
        op = "qlinear_conv"
        attrs.update({k: p.attrs[k] for k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
                      if k in p.attrs})
        bias_in = p.inputs[2] if len(p.inputs) > 2 else None
        channels = wq.shape[0]
    else:
        op = "qlinear_matmul"
        wq, trans_b, bias_in = _matmul_weight(p, w, wq, transposed)
        channels = wq.shape[1]
    new: list[Node] = []

    def const(value: np.ndarray, hint: str) -> Value:
        val = Value(names(f"{q.outputs[0].name}/{hint}"), TensorType(DType.from_np(value.dtype), value.shape))
        new.append(Node("constant", [], [val], {"value": value}))
        return val

    w_val = const(wq, "w") if trans_b else w.q
    if added_bias is not None and bias_in is not None:
        raise _UnfoldableError("the gemm has a bias and another is added to its result")
    float_bias = added_bias
    if bias_in is not None and (bias_in.producer is None or bias_in.producer.op != "dequantize_linear"):
        float_bias = const_of(bias_in) if bias_in.type.dtype.is_float else None
        if float_bias is None:
            raise _UnfoldableError("the bias is neither a dequantized int32 constant nor a constant float tensor")
    if float_bias is not None:
        bq, moves[q.name] = _float_bias(float_bias, x, w, channels, ys)
        bias: Value | None = const(bq, "bias")
    else:
        bias = _bias(bias_in, x, w, channels)
    ins: list[Value | None] = [
        x.q, _param(x.node, 1), _zero(x, const, "x_zp"),
        w_val, _param(w.node, 1), _zero(w, const, "w_zp"),
        q.inputs[1], q.inputs[2] if yzp is not None else const(np.zeros((), out_dt.np), "y_zp"),
    ]
    if bias is not None:
        ins.append(bias)
    fused = Node(op, ins, [q.outputs[0]], attrs, q.name)
    q.outputs[0].producer = fused
    new.append(fused)
    return new, gone


def _weight_dq(p: Node) -> tuple[_Dq, bool]:
    """The dequantization of a product's weight, and whether a matmul reads it through a 2-D
    transpose (``nn.Linear`` on more than two dims, from ``torch.export``)."""
    v = p.inputs[1]
    t = v.producer if v is not None else None
    if p.op == "matmul" and t is not None and t.op == "transpose" and t.outputs[0].type.rank == 2:
        return _dq(t.inputs[0], "the weight"), True
    return _dq(v, "the weight"), False


def _matmul_weight(p: Node, w: _Dq, wq: np.ndarray, transposed: bool) -> tuple[np.ndarray, bool, Value | None]:
    """Rules 2 and 4 for a matmul or gemm: its weight as [K, N] (transposed when ``transB``, or when
    the matmul reads it ``transposed``), whether it was transposed, and the bias input (gemm's ``C``)."""
    trans_b = transposed
    bias_in = None
    if wq.ndim != 2:
        raise _UnfoldableError("the weight is not 2-D")
    if p.op == "gemm":
        a = get("gemm").fill_attrs(p.attrs)
        if a["transA"] or float(a["alpha"]) != 1.0 or float(a["beta"]) != 1.0:
            raise _UnfoldableError("gemm with transA, alpha or beta")
        trans_b = bool(a["transB"])
        bias_in = p.inputs[2] if len(p.inputs) > 2 else None
    if w.axis not in (None, 0 if trans_b else 1):
        raise _UnfoldableError(f"the weight is quantized along axis {w.axis}, not its columns")
    return (np.ascontiguousarray(wq.T) if trans_b else wq), trans_b, bias_in


def fold_float_products(g: Graph, products: list[Node]) -> list[Node]:
    """Each float32 ``matmul``/``gemm`` of ``products`` (nodes of ``g``) whose operands pass rules 2
    to 4 (the scales float32, the data input dequantized to float32) becomes one
    ``qlinear_matmul_float``: the integer product plus the int32 bias, times ``x_scale * w_scale``
    (the float product of the dequantized operands is the same sum, rounded differently).  Returns
    the products that stay float32; the dequantizes left unread are removed."""
    names = _Names(g)
    replaced: dict[Node, list[Node]] = {}
    kept: list[Node] = []
    stale: list[Value] = []
    for p in products:
        try:
            if p.op not in ("matmul", "gemm") or p.outputs[0].type.dtype is not DType.f32:
                raise _UnfoldableError("not a float32 matmul or gemm")
            replaced[p] = _fold_float(p, names)
        except _UnfoldableError as why:
            _log.debug("fold-qdq: %r (%s) stays float: %s", p.name, p.op, why)
            kept.append(p)
            continue
        stale.extend(v for v in p.inputs if v is not None)
    if replaced:
        rebuild(g, replaced, set())
        _drop_dead(g, stale)
    return kept


def _fold_float(p: Node, names: _Names) -> list[Node]:
    """The float32 product ``p`` of dequantized operands as one ``qlinear_matmul_float``."""
    x = _dq(p.inputs[0], "the data input")
    if x.axis is not None or x.q.type.dtype not in _BYTES or x.node.outputs[0].type.dtype is not DType.f32:
        raise _UnfoldableError("the data input is not a per-tensor int8/uint8 dequantization to float32")
    w, transposed = _weight_dq(p)
    wq = const_of(w.q)
    if wq is None or w.q.type.dtype not in _BYTES:
        raise _UnfoldableError("the weight is not a constant int8/uint8 tensor")
    if x.scale is None or w.scale is None or x.scale.dtype != np.float32 or w.scale.dtype != np.float32:
        raise _UnfoldableError("the scales are not float32")
    wq, trans_b, bias_in = _matmul_weight(p, w, wq, transposed)
    new: list[Node] = []
    out = p.outputs[0]

    def const(value: np.ndarray, hint: str) -> Value:
        val = Value(names(f"{out.name}/{hint}"), TensorType(DType.from_np(value.dtype), value.shape))
        new.append(Node("constant", [], [val], {"value": value}))
        return val

    bias = _bias(bias_in, x, w, wq.shape[1])
    ins: list[Value | None] = [x.q, _param(x.node, 1), _zero(x, const, "x_zp"),
                               const(wq, "w") if trans_b else w.q, _param(w.node, 1), _zero(w, const, "w_zp")]
    if bias is not None:
        ins.append(bias)
    fused = Node("qlinear_matmul_float", ins, [out], {}, p.name)
    out.producer = fused
    new.append(fused)
    return new


def _fold_add(g: Graph, q: Node, counts: dict[Value, int], names: _Names) -> tuple[list[Node], set[Node]]:
    """Rule 9: ``quantize(add(dequantize(a), dequantize(b)) [-> relu])`` as one ``qlinear_add``."""
    v = q.inputs[0]
    assert v is not None and v.producer is not None
    gone: set[Node] = set()
    relu = v.producer.op == "relu"
    if relu:
        _single_use(v, counts, g, "the relu's result")
        gone.add(v.producer)
        v = v.producer.inputs[0]
        assert v is not None and v.producer is not None
    add = v.producer
    assert add is not None
    _single_use(v, counts, g, "the add's result")
    gone.add(add)
    ys, yzp = _output_params(q)
    if ys.dtype != np.float32 or q.attrs.get("precision") not in (None, DType.f32):
        raise _UnfoldableError("the output quantization does not divide in float32")
    ins: list[Value | None] = []
    shapes = []
    for i, what in ((0, "the add's first operand"), (1, "the add's second operand")):
        d = _dq(add.inputs[i], what)
        if d.axis is not None or d.q.type.dtype not in _BYTES:
            raise _UnfoldableError(f"{what} is not a per-tensor int8/uint8 dequantization")
        assert d.scale is not None
        if d.scale.dtype != np.float32 or d.node.outputs[0].type.dtype is not DType.f32:
            raise _UnfoldableError(f"{what} is not dequantized in float32")
        ins += [d.q, _param(d.node, 1), d.node.inputs[2] if d.zp is not None else None]
        shapes.append(d.q.type.shape)
    if shapes[0] != shapes[1] or not all(isinstance(x, int) for x in shapes[0]):
        raise _UnfoldableError("the add's operands do not have one static shape")
    new: list[Node] = []

    def zero(of: Value, hint: str) -> Value:
        """A zero point of ``of``'s type for an absent one."""
        val = Value(names(f"{q.outputs[0].name}/{hint}"), TensorType(of.type.dtype, ()))
        new.append(Node("constant", [], [val], {"value": np.zeros((), of.type.dtype.np)}))
        return val

    for i, hint in ((2, "a_zp"), (5, "b_zp")):
        if ins[i] is None:
            operand = ins[i - 2]
            assert operand is not None
            ins[i] = zero(operand, hint)
    yz = q.inputs[2] if yzp is not None else zero(q.outputs[0], "y_zp")
    fused = Node("qlinear_add", [*ins, q.inputs[1], yz], [q.outputs[0]], {"relu": int(relu)}, q.name)
    q.outputs[0].producer = fused
    new.append(fused)
    return new, gone


def _param(n: Node, i: int) -> Value:
    v = n.inputs[i]
    assert v is not None
    return v


def _zero(d: _Dq, const: object, hint: str) -> Value:
    """The zero point input of ``d`` (a zero constant of the quantized type when absent)."""
    if d.zp is not None:
        return _param(d.node, 2)
    assert d.scale is not None and callable(const)
    value: Value = const(np.zeros(d.scale.shape, d.q.type.dtype.np), hint)
    return value


def _bias(b: Value | None, x: _Dq, w: _Dq, channels: int) -> Value | None:
    """Rule 3: the int32 bias, when its dequantization is exactly the product's scale."""
    if b is None:
        return None
    d = _dq(b, "the bias")
    bq = const_of(d.q)
    if bq is None or bq.dtype != np.int32 or bq.shape != (channels,):
        raise _UnfoldableError("the bias is not a constant 1-D int32 tensor")
    if d.zp is not None and np.any(d.zp != 0):
        raise _UnfoldableError("the bias has a nonzero zero point")
    assert x.scale is not None and w.scale is not None and d.scale is not None
    expect = np.ascontiguousarray(np.broadcast_to(x.scale.reshape(()) * w.scale.reshape(-1), (channels,)))
    have = np.ascontiguousarray(np.broadcast_to(d.scale.reshape(-1), (channels,)))
    if have.dtype != expect.dtype or have.tobytes() != expect.tobytes():  # bit for bit
        raise _UnfoldableError("the bias scale is not exactly x_scale * w_scale")
    return d.q


def _float_bias(bf: np.ndarray, x: _Dq, w: _Dq, channels: int, ys: np.ndarray) -> tuple[np.ndarray, float]:
    """Rule 3 for a float bias ``bf``: its int32 values at ``x_scale * w_scale``, and how far that
    moves a value, in output steps."""
    if bf.shape != (channels,):
        raise _UnfoldableError(f"the float bias has shape {bf.shape}, not ({channels},)")
    assert x.scale is not None and w.scale is not None
    scale = np.broadcast_to(x.scale.reshape(()) * w.scale.reshape(-1), (channels,)).astype(np.float64)
    step = float(np.asarray(ys, np.float64).reshape(()))
    if not (np.isfinite(scale).all() and (scale > 0).all() and np.isfinite(step) and step > 0):
        raise _UnfoldableError("x_scale * w_scale or the output scale is not positive and finite")
    exact = bf.astype(np.float64)
    q = np.rint(exact / scale)
    if not np.isfinite(q).all() or np.abs(q).max(initial=0) > 2**30:
        raise _UnfoldableError("the float bias does not fit in int32 at x_scale * w_scale")
    move = float(np.abs(exact - q * scale).max(initial=0)) / step
    if move > FLOAT_BIAS_STEPS:
        raise _UnfoldableError(f"rounding the float bias to int32 at x_scale * w_scale would move values by "
                               f"{move:.3g} output steps (at most {FLOAT_BIAS_STEPS:.3g} folds)")
    return q.astype(np.int32), move


def _dequantize_constants(g: Graph) -> list[Node]:
    """Rule 6: ``dequantize_linear`` of constants becomes a float constant (the same value); returns the nodes replaced."""
    done: list[Node] = []
    opdef = get("dequantize_linear")
    assert opdef.reference is not None
    for i, n in enumerate(g.nodes):
        if n.op != "dequantize_linear":
            continue
        args = [const_of(v) if v is not None else None for v in n.inputs]
        if any(v is not None and a is None for v, a in zip(n.inputs, args)):
            continue
        (value,) = opdef.reference(RefCtx(n.op, list(args), get(n.op).fill_attrs(n.attrs), [n.outputs[0].type]))
        out = n.outputs[0]
        g.nodes[i] = Node("constant", [], [out], {"value": np.asarray(value)}, n.name)
        out.producer = g.nodes[i]
        done.append(n)
    return done


def _drop_dead(g: Graph, stale: list[Value]) -> None:
    """Remove the constants, dequantize nodes and transposes (of weights) among ``stale``'s producers
    (and theirs) left unread."""
    while stale:
        counts = use_counts(g)
        dead = {v.producer for v in stale if v.producer is not None
                and v.producer.op in ("constant", "dequantize_linear", "transpose")
                and all(counts.get(o, 0) == 0 for o in v.producer.outputs) and v not in g.outputs}
        if not dead:
            return
        g.nodes = [n for n in g.nodes if n not in dead]
        stale = [v for n in dead for v in n.inputs if v is not None]

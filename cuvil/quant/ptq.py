"""Post-training int8 quantization: the explicit quantize/dequantize graph, from calibration data.

Where it runs.  ``cuvil.compile(..., quant_dtype="int8")`` runs the target's passes up to
and including ``fold-batchnorm`` (so a convolution is quantized with its batch norm
already folded into its weights), then this module, then the rest of the pipeline:
``fold-qdq`` (when registered; not on ``ref``, whose quantize/dequantize graph is the
semantic definition) before the fusion passes, so that it sees plain ``conv -> relu``
patterns.  Calibration runs the float32 graph as it stands just before quantization, on a
native C build of it tapped at the observed tensors (``cuvil/quant/calibrate.py``).

The rules (:func:`plan` and :func:`quantize_graph`), chosen so that every quantized node is
one ``fold-qdq`` can turn into an integer kernel:

1. A quantizable node is a ``conv``, ``gemm`` or ``matmul`` of the top graph (control-flow
   regions stay float32) whose data operand (``X``, ``A``) is computed at run time, whose
   weight (``W``, ``B``) is a constant, and whose operands and result are f32.  A product of
   two computed tensors (attention's ``Q @ K^T``) stays float32: no integer kernel takes it,
   so quantizing it would only add error.
2. The weight becomes symmetric int8 in ``[-127, 127]`` (``[-64, 64]`` with ``reduce_range``: 7-bit
   weights, which the AVX2 kernels multiply faster, exactly), per output channel when
   ``per_channel`` (axis 0 of a conv weight; the ``N`` axis of a gemm's or matmul's ``B``),
   else per tensor, read through a ``dequantize_linear``.  A constant 1-D bias (conv's ``B``,
   gemm's ``C``) becomes int32 at scale ``x_scale * w_scale`` (per channel; computed in
   float32), zero point 0, as the integer kernels add it.
3. The data operand and the node's result are activations, quantized per tensor: int8 with
   zero point 0 (``symmetric``) or uint8 with a zero point, the range from the calibration
   set (``minmax``, ``percentile`` or ``entropy``: ``cuvil/quant/observers.py``).  Where the
   result's only reader is a ``relu``, or a ``clip`` from a constant 0 to a constant positive
   (or absent) upper bound (ReLU6), that reader's result is the quantized tensor instead, so
   its range is the post-activation range (the integer kernel applies the relu; ``fold-qdq``
   checks that the clip's upper bound saturates, which a range observed below it ensures).  A
   graph output is never quantized: the node's result then stays float32.
4. Each activation gets one ``quantize_linear -> dequantize_linear`` pair right after its
   producer (at the top for a graph input).  A quantized node's result (rule 3) is read
   through its dequantize by every reader, since the integer kernel produces only the
   quantized value; any other activation is read through it only by quantized nodes.  Ops
   that cannot be quantized therefore run in float32 between a dequantize and a quantize.
5. Every value of the float32 graph keeps its name; the added values are named after the
   tensor they quantize (``x_scale``, ``x_quantized``, ``w_int8`` ...).
6. Integer-produced activations (the results of rule 3, and of rules 7 and 8) let two more ops
   run on 8-bit data, in definition order.  A ``max_pool`` (one output) of an integer-produced
   activation that is not a graph output gets its input's scale and zero point (max commutes
   with the nondecreasing dequantization, so this adds no error; ``fold-qdq`` rule 7 runs it on
   the quantized tensor).
7. An ``add`` of two computed f32 activations of one static shape whose result (or, as in rule
   3, the result of its only reader when that is a ``relu``) is not a graph output and is read
   by a quantized node of rule 1 or another such ``add``, reads both operands through their
   dequantizes (quantizing an operand that rule 3 does not) and has that result quantized as an
   activation (``fold-qdq`` rule 9 makes it a ``qlinear_add``): a residual connection into a
   quantized convolution.  Adds read by no quantized node (a transformer's residual into a
   layer norm) stay float32.
8. The results of rules 6 and 7 are integer-produced: every reader reads them through their
   dequantize, as in rule 4.
9. A quantized ``gemm`` or ``matmul`` whose result is a graph output (rule 3: it stays float32)
   becomes one ``qlinear_matmul_float`` (``fold_float_products``, ``cuvil/passes/fold_qdq.py``):
   the integer product plus the int32 bias, dequantized at ``x_scale * w_scale``, so a
   classifier reads its int8 weights instead of float32 ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ops.common import const_of, infer_all
from cuvil.ops.registry import get
from cuvil.passes.base import Pass
from cuvil.passes.fold_qdq import fold_float_products
from cuvil.quant.accuracy import Dequantize, PrecisionReport
from cuvil.quant.calibrate import (
    CalibrationRunner,
    RunnerOptions,
    calibration_runner,
    check_coverage,
    confirm_batch_axis,
    observe,
)
from cuvil.quant.data import CalibrationSet, calibration_set
from cuvil.quant.observers import (
    METHODS,
    ONE_SIDED_ADVICE,
    ONE_SIDED_WARNING,
    REDUCED_WEIGHT_QMAX,
    WEIGHT_QMAX,
    QParams,
    activation_qparams,
    quantize_weight,
)

if TYPE_CHECKING:
    from cuvil.pipeline import Pipeline

log = logging.getLogger("cuvil.quant")

QUANT_DTYPES = ("int8",)
MIN_SAMPLES = 64
QUANTIZABLE = ("conv", "gemm", "matmul")


class QuantizationError(CuvilError):
    """An int8 compile that Cuvil refuses: missing or too little calibration data, bad options."""


@dataclass(frozen=True)
class QuantOptions:
    """The options of ``cuvil.compile(..., quant_dtype=...)``."""

    dtype: str = "int8"
    symmetric: bool = True
    per_channel: bool = True
    method: str = "minmax"
    percentile: float = 99.99
    min_samples: int | None = None  # None: MIN_SAMPLES; an explicit number overrides it
    reduce_range: bool = False  # weights in [-64, 64] instead of [-127, 127]

    @property
    def weight_qmax(self) -> int:
        return REDUCED_WEIGHT_QMAX if self.reduce_range else WEIGHT_QMAX

    def __post_init__(self) -> None:
        if self.dtype not in QUANT_DTYPES:
            raise QuantizationError(f"quant_dtype={self.dtype!r} is not supported; choose one of {QUANT_DTYPES}")
        if self.method not in METHODS:
            raise QuantizationError(f"calibration={self.method!r} is not a calibration method; choose one of "
                                    f"{', '.join(METHODS)}")
        for name, flag in (("symmetric", self.symmetric), ("per_channel", self.per_channel),
                           ("reduce_range", self.reduce_range)):
            if not isinstance(flag, bool | np.bool_):
                raise QuantizationError(f"{name}={flag!r} must be True or False")
        if not 50.0 < self.percentile <= 100.0:
            raise QuantizationError(f"percentile={self.percentile} must be in (50, 100]")
        if self.min_samples is not None and (isinstance(self.min_samples, bool) or not isinstance(
                self.min_samples, int) or self.min_samples < 1):
            raise QuantizationError(f"min_calibration_samples={self.min_samples!r} must be a positive int")


@dataclass(frozen=True)
class WeightQuant:
    name: str
    node: str
    axis: int | None  # the per-channel axis, None per tensor
    channels: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "axis": self.axis, "channels": self.channels}


@dataclass
class QuantReport:
    """What a post-training quantization did: per tensor its parameters, and what it warned about."""

    options: QuantOptions
    examples: int = 0
    feeds: int = 0
    activations: dict[str, QParams] = field(default_factory=dict)
    weights: list[WeightQuant] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)  # the quantized nodes
    skipped: list[str] = field(default_factory=list)  # candidate nodes left in float32, and why
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    runner: dict[str, Any] = field(default_factory=dict)  # how the float32 graph ran (calibrate.py)

    def to_json(self) -> dict[str, Any]:
        o = self.options
        return {"dtype": o.dtype, "symmetric": o.symmetric, "per_channel": o.per_channel, "reduce_range": o.reduce_range,
                "weight_range": [-o.weight_qmax, o.weight_qmax], "calibration": o.method,
                "percentile": o.percentile if o.method == "percentile" else None, "examples": self.examples,
                "feeds": self.feeds, "seconds": self.seconds,
                "activations": {k: v.to_json() for k, v in self.activations.items()},
                "weights": [w.to_json() for w in self.weights], "nodes": list(self.nodes),
                "skipped": list(self.skipped), "warnings": list(self.warnings), "runner": dict(self.runner)}


@dataclass(frozen=True)
class QuantNode:
    """One node to quantize (rules 1-4): its data operand, weight, bias and the tensor its result is
    quantized as (None when that tensor is a graph output)."""

    node: Node
    data: int  # index of the activation operand
    weight: int  # index of the constant weight operand
    axis: int | None  # the weight's per-channel axis (None: per tensor)
    bias: int | None  # index of a constant 1-D bias quantized to int32
    output: Value | None


@dataclass(frozen=True)
class IntegerOps:
    """Rules 6-8: the max-pools that pass their input's parameters on (result value -> input value),
    the adds run on 8-bit operands, and every value an integer kernel produces."""

    pools: dict[Value, Value] = field(default_factory=dict)
    adds: list[Node] = field(default_factory=list)
    produced: set[Value] = field(default_factory=set)

    def observed(self) -> set[Value]:
        """The activations calibration must observe for rule 7 (rule 6's take their input's range)."""
        seen: set[Value] = set()
        for n in self.adds:
            seen.update(v for v in n.inputs if v is not None)
        return (seen | self.produced) - set(self.pools)


def _integer_ops(graph: Graph, nodes: Sequence[QuantNode]) -> IntegerOps:
    """Rules 6-8 on ``graph``, given the quantized nodes of rules 1-4."""
    users = graph.users()
    outputs = set(graph.outputs)
    quantized = {q.node for q in nodes}
    ops = IntegerOps(produced={q.output for q in nodes if q.output is not None})

    def result(n: Node) -> Value:  # rule 3's reading: through a sole relu reader
        y = n.outputs[0]
        readers = users.get(y, [])
        return readers[0].outputs[0] if len(readers) == 1 and readers[0].op == "relu" and y not in outputs else y

    def feeds_integer(v: Value, depth: int = 0) -> bool:
        """Whether a quantized node, or an add that would qualify, reads ``v``."""
        for r in users.get(v, []):
            if r in quantized or (r.op == "add" and depth < 64 and _static_add(r) and
                                  result(r) not in outputs and feeds_integer(result(r), depth + 1)):
                return True
        return False

    for n in graph.nodes:
        if n.op == "max_pool" and len(n.outputs) == 1 and n.inputs[0] in ops.produced and \
                n.outputs[0] not in outputs:
            x = n.inputs[0]
            assert x is not None
            ops.pools[n.outputs[0]] = x
            ops.produced.add(n.outputs[0])
        elif n.op == "add" and _static_add(n):
            y = result(n)
            if y not in outputs and feeds_integer(y):
                ops.adds.append(n)
                ops.produced.add(y)
    return ops


def _static_add(n: Node) -> bool:
    """An add of two computed f32 tensors and its result, all of one static shape."""
    vs = [*n.inputs, *n.outputs]
    if len(n.inputs) != 2 or any(v is None or const_of(v) is not None for v in n.inputs):
        return False
    shapes = {v.type.shape for v in vs if v is not None}
    return len(shapes) == 1 and all(v is not None and v.type.dtype is DType.f32 and v.type.is_static
                                    for v in vs)


def split_pipeline(target: str, enable_fusion: bool) -> tuple[list[Pass], list[Pass]]:
    """The passes an int8 compile for ``target`` runs before quantization (up to and including
    ``fold-batchnorm``) and after it: ``cuvil.pipeline.build_pipeline``'s, split."""
    from cuvil.options import CompileOptions, QuantizationOptions
    from cuvil.pipeline import build_pipeline

    p = build_pipeline(target, CompileOptions(enable_fusion=enable_fusion, faults=frozenset(),
                                              quantization=QuantizationOptions(dtype="int8")))
    return p.before_quantization(), p.after_quantization()


def plan(graph: Graph, per_channel: bool) -> tuple[list[QuantNode], list[str]]:
    """The nodes to quantize (rules 1-4), and the candidate nodes left in float32 with why."""
    out: list[QuantNode] = []
    skipped: list[str] = []
    users = graph.users()
    outputs = set(graph.outputs)
    for n in graph.nodes:
        if n.op not in QUANTIZABLE:
            continue
        what = f"{n.name or n.op} ({n.op})"
        x, w = n.inputs[0], n.inputs[1]
        assert x is not None and w is not None
        bad = [v for v in (x, w, *n.outputs) if v.type.dtype is not DType.f32]
        if bad:
            skipped.append(f"{what}: {bad[0].name!r} is {bad[0].type.dtype}; only f32 is quantized")
            continue
        if const_of(w) is None or const_of(x) is not None:
            skipped.append(f"{what}: it needs a computed data operand and a constant weight")
            continue
        axis = _weight_axis(n, w) if per_channel else None
        b = n.inputs[2] if len(n.inputs) > 2 else None
        bias = 2 if b is not None and const_of(b) is not None and b.type.rank == 1 and b.type.dtype is DType.f32 \
            else None
        y = n.outputs[0]
        readers = users.get(y, [])
        if len(readers) == 1 and _is_activation(readers[0]) and y not in outputs:
            y = readers[0].outputs[0]
        out.append(QuantNode(n, 0, 1, axis, bias, None if y in outputs else y))
    return out, skipped


def _is_activation(n: Node) -> bool:
    """Rule 3: a ``relu``, or a ``clip`` from a constant 0 to a constant positive or absent bound."""
    if n.op == "relu":
        return True
    if n.op != "clip" or len(n.inputs) < 2 or n.inputs[1] is None:
        return False
    lo = const_of(n.inputs[1])
    hi_v = n.inputs[2] if len(n.inputs) > 2 else None
    hi = const_of(hi_v) if hi_v is not None else None
    if lo is None or lo.size != 1 or float(lo.reshape(-1)[0]) != 0.0:
        return False
    return hi_v is None or (hi is not None and hi.size == 1 and float(hi.reshape(-1)[0]) > 0.0)


def _weight_axis(n: Node, w: Value) -> int | None:
    """The output-channel axis of ``n``'s constant weight (None: per tensor)."""
    if n.op == "conv":
        return 0
    if w.type.rank < 2:
        return None  # a 1-D B: one output column
    if n.op == "gemm":
        return 0 if get("gemm").fill_attrs(n.attrs)["transB"] else 1
    return w.type.rank - 1


def post_training_quantize(graph: Graph, dataset: Any, options: QuantOptions,
                           runner: RunnerOptions | None = None) -> tuple[Graph, QuantReport]:
    """``graph`` (float32, after ``fold-batchnorm``) with quantize/dequantize nodes from the ranges of
    ``dataset`` (any form ``cuvil.quant.data`` takes, or a :class:`CalibrationSet` made for ``graph``).

    Refuses (:class:`QuantizationError`, or the calibration errors) missing data, fewer examples
    than ``options.min_samples`` (default :data:`MIN_SAMPLES`), and data that never exercises a
    range of shapes the model declares (``cuvil.quant.calibrate.check_coverage``).  ``runner``: the
    C compiler, build cache and threads of the calibration build.  ``graph`` is changed in place and
    returned."""
    t0 = time.perf_counter()
    calib = dataset if isinstance(dataset, CalibrationSet) else load_calibration(dataset, graph, options)
    need = MIN_SAMPLES if options.min_samples is None else options.min_samples
    if calib.examples_settled:
        _check_enough(calib, need, options)  # refused before any build
    nodes, skipped = plan(graph, options.per_channel)
    integer = _integer_ops(graph, nodes)
    acts = _activations(graph, nodes, integer)
    computed = [v for v in acts if v not in set(graph.inputs)]
    runner_options = runner or RunnerOptions()
    run = (calibration_runner(graph, computed, runner_options) if computed else
           CalibrationRunner("none", lambda feed: [], why="only graph inputs are observed"))
    calib = confirm_batch_axis(graph, calib, run)  # a symbolic axis 0 may be a sequence, not a batch
    _check_enough(calib, need, options)
    check_coverage(graph, calib)
    report = QuantReport(options, calib.examples, len(calib.feeds))
    report.skipped = skipped
    observers, ran = observe(graph, acts, calib, options.method, options.symmetric, runner_options, run)
    report.runner = ran.to_json()
    params: dict[Value, QParams] = {}
    one_sided: list[str] = []  # "name [min, max]" of the tensors that got the one-sided warning
    for v in acts:
        o = observers[v]
        lo, hi = o.clip_range(options.method, options.symmetric, options.percentile)
        qp, warns = activation_qparams(v.name, lo, hi, (o.min, o.max), options.symmetric)
        params[v] = qp
        report.activations[v.name] = qp
        report.warnings.extend(warns)
        if any(ONE_SIDED_WARNING in w for w in warns):
            one_sided.append(f"{v.name!r} [{o.min:.4g}, {o.max:.4g}]")
    for y, x in integer.pools.items():  # rule 6, in definition order: a pool of a pool is found filled
        params[y] = params[x]
    quantize_graph(graph, nodes, params, report, integer)
    _log_warnings(report.warnings, one_sided)
    report.seconds = time.perf_counter() - t0
    log.info("int8 post-training quantization: %d nodes, %d activations, %d weights in [-%d, %d] from %d examples "
             "(%s calibration, %s; %d calls of the %s runner) in %.2f s", len(report.nodes), len(acts),
             len(report.weights), options.weight_qmax, options.weight_qmax, calib.examples, options.method,
             "symmetric" if options.symmetric else "asymmetric", ran.calls, ran.kind, report.seconds)
    return graph, report


def _check_enough(calib: CalibrationSet, need: int, options: QuantOptions) -> None:
    """Refuse fewer calibration examples than ``need``, saying what to do."""
    if calib.examples < need:
        how = ("give more samples" if options.min_samples is not None else
               f"give at least {MIN_SAMPLES} samples (ranges from fewer rarely hold on unseen inputs), or accept "
               f"the risk explicitly with min_calibration_samples={calib.examples} (on the command line: "
               f"--min-calibration-samples {calib.examples})")
        raise QuantizationError(f"int8 calibration got {calib.examples} samples, fewer than the {need} required: "
                                f"{how}")


def load_calibration(dataset: Any, graph: Graph, options: QuantOptions) -> CalibrationSet:
    """The calibration set of ``dataset`` for ``graph``; refuses a missing one."""
    if dataset is None:
        raise QuantizationError(
            f"quant_dtype={options.dtype!r} needs calibration data to choose its scales: pass "
            "calibration_dataset= (a DataLoader, or an iterable of input tuples or dicts; on the command line "
            f"--calibration DIR of .npz files) with at least {MIN_SAMPLES} samples drawn like the inputs the model "
            "will see")
    return calibration_set(dataset, graph)


def _activations(graph: Graph, nodes: Sequence[QuantNode], integer: IntegerOps | None = None) -> list[Value]:
    """The activations to observe, in definition order (graph inputs first), each once."""
    wanted = {q.node.inputs[q.data] for q in nodes} | {q.output for q in nodes if q.output is not None}
    if integer is not None:
        wanted |= integer.observed()
    order = [v for v in graph.inputs if v in wanted]
    order += [o for n in graph.nodes for o in n.outputs if o in wanted]
    return order


def quantize_graph(graph: Graph, nodes: Sequence[QuantNode], params: dict[Value, QParams],
                   report: QuantReport, integer: IntegerOps | None = None) -> None:
    """Insert the quantize/dequantize nodes of rules 2-8 into ``graph`` (in place)."""
    from cuvil.passes.dce import DeadCodeElimination

    names = _Names(graph)
    dq: dict[Value, Value] = {}
    new_nodes: list[Node] = []

    def emit(op: str, inputs: list[Value | None], attrs: dict[str, Any], name: str, node_name: str) -> Value:
        types, full, _ = infer_all(op, inputs, attrs, 1, graph.symbols)
        out = Value(names.fresh(name), types[0])
        new_nodes.append(Node(op, inputs, [out], full, node_name))
        return out

    def const(value: np.ndarray, name: str) -> Value:
        return emit("constant", [], {"value": value}, name, name)

    def qdq_activation(v: Value) -> None:
        qp = params[v]
        scale = const(np.array(qp.scale, np.float32), f"{v.name}_scale")
        zp = const(np.array(qp.zero_point, qp.dtype.np), f"{v.name}_zero_point")
        q = emit("quantize_linear", [v, scale, zp], {}, f"{v.name}_quantized", f"{v.name}_quantize")
        dq[v] = emit("dequantize_linear", [q, scale, zp], {}, f"{v.name}_dequantized", f"{v.name}_dequantize")

    def dq_weight(qn: QuantNode) -> np.ndarray:
        """Rewire the weight through a dequantize of its int8 form; its scales."""
        v = qn.node.inputs[qn.weight]
        w = const_of(v)
        assert v is not None and w is not None
        wq, scales = quantize_weight(v.name, w, qn.axis, report.options.weight_qmax)
        qv = const(wq, f"{v.name}_int8")
        shape = () if qn.axis is None else scales.shape
        scale = const(scales.reshape(shape), f"{v.name}_scale")
        zp = const(np.zeros(shape, np.int8), f"{v.name}_zero_point")
        attrs = {} if qn.axis is None else {"axis": qn.axis}
        qn.node.inputs[qn.weight] = emit("dequantize_linear", [qv, scale, zp], attrs, f"{v.name}_dequantized",
                                         f"{v.name}_dequantize")
        report.weights.append(WeightQuant(v.name, qn.node.name, qn.axis, int(scales.size)))
        return scales

    def dq_bias(qn: QuantNode, x: Value, w_scales: np.ndarray) -> None:
        """Rewire the bias through a dequantize of int32 values at scale ``x_scale * w_scale``."""
        assert qn.bias is not None
        v = qn.node.inputs[qn.bias]
        b = const_of(v)
        assert v is not None and b is not None
        scale = (np.float32(params[x].scale) * w_scales).astype(np.float32)  # in float32, as the kernel has it
        per = np.broadcast_to(scale, b.shape) if scale.size > 1 else scale.reshape(())
        q = np.rint(b.astype(np.float64) / per.astype(np.float64))
        if np.any(np.abs(q) > np.iinfo(np.int32).max):
            raise QuantizationError(f"bias {v.name!r} of {qn.node.name!r} does not fit int32 at scale x_scale * "
                                    "w_scale: its input's or weight's range is degenerate")
        qv = const(q.astype(np.int32), f"{v.name}_int32")
        sv = const(np.asarray(per, np.float32).copy(), f"{v.name}_scale")
        attrs = {"axis": 0} if scale.size > 1 else {}
        qn.node.inputs[qn.bias] = emit("dequantize_linear", [qv, sv], attrs, f"{v.name}_dequantized",
                                       f"{v.name}_dequantize")

    by_node = {qn.node: qn for qn in nodes}
    outputs = {qn.output for qn in nodes if qn.output is not None}
    adds: set[Node] = set()
    if integer is not None:
        outputs |= integer.produced
        adds = set(integer.adds)
    for v in graph.inputs:
        if v in params:
            qdq_activation(v)
    for n in graph.nodes:
        qn = by_node.get(n)
        if qn is not None:
            x = n.inputs[qn.data]
            assert x is not None
            n.inputs[qn.data] = dq[x]
            w_scales = dq_weight(qn)
            if qn.bias is not None:
                dq_bias(qn, x, w_scales)
            report.nodes.append(n.name or n.op)
        else:
            # a quantized node's output is read through its dequantize by everyone (the integer kernel
            # gives only the quantized value); other activations only by the quantized nodes (and
            # rule 7's adds)
            for i, r in enumerate(n.inputs):
                if r is not None and (r in outputs or n in adds) and r in dq:
                    n.inputs[i] = dq[r]
        new_nodes.append(n)
        for o in n.outputs:
            if o in params:
                qdq_activation(o)
    graph.nodes = new_nodes
    fold_float_products(graph, [qn.node for qn in nodes if qn.output is None])  # rule 9
    DeadCodeElimination().run(graph)  # the float32 weights nothing reads any more


class _Names:
    """Fresh value names that no value of the graph (at any depth) has."""

    def __init__(self, graph: Graph) -> None:
        self.taken = {v.name for v in graph.inputs}
        for n in graph.walk():
            self.taken.update(o.name for o in n.outputs)
            for _, r in n.regions():
                self.taken.update(v.name for v in r.inputs)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name


@dataclass
class QuantAccuracyReport(PrecisionReport):
    """An int8 compile's report: the per-layer errors against the float32 graph, and the quantization."""

    quantization: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "quantization": self.quantization}


# More one-sided tensors than this are logged as one warning that lists them all (a ReLU network has
# one per activation); the precision report keeps one warning per tensor either way.
ONE_SIDED_LOG_LIMIT = 3


def _log_warnings(warnings: Sequence[str], one_sided: Sequence[str]) -> None:
    """Log the quantization's warnings on ``cuvil.quant``, each once; the one-sided ones (``one_sided``
    names their tensors and ranges) in one line when there are many."""
    grouped = len(one_sided) > ONE_SIDED_LOG_LIMIT
    for w in warnings:
        if not (grouped and ONE_SIDED_WARNING in w):
            log.warning("%s", w)
    if grouped:
        log.warning("%d tensors have one-sided ranges under symmetric int8 quantization, each using about half of "
                    "the 256 codes (~7 bits of resolution): %s; %s", len(one_sided), ", ".join(one_sided),
                    ONE_SIDED_ADVICE)


def _int8_forms(graph: Graph) -> dict[str, Dequantize]:
    """Each activation's int8 value by name (the quantize's output: a folded kernel that computes it
    keeps the name), with the float32 value it stands for and its per-tensor scale and zero point."""
    out: dict[str, Dequantize] = {}
    for n in graph.nodes:
        if n.op != "quantize_linear" or n.inputs[0] is None or len(n.inputs) < 3:
            continue
        scale, zp = (const_of(v) if v is not None else None for v in n.inputs[1:3])
        if scale is not None and zp is not None and scale.size == 1 and zp.size == 1:
            out[n.outputs[0].name] = Dequantize(n.inputs[0].name, float(scale.reshape(())), int(zp.reshape(())))
    return out


def compile_int8(graph: Graph, copy: bool, pipeline: Pipeline, dataset: Any, options: QuantOptions,
                 report_samples: int, times: dict[str, float], runner: RunnerOptions | None = None
                 ) -> tuple[Graph, QuantAccuracyReport]:
    """What ``cuvil.compile(..., quant_dtype=...)`` does between import and code generation: the passes
    of ``pipeline`` (``cuvil.pipeline.build_pipeline``'s, for the compile's target and options) up to
    its quantization point (after ``fold-batchnorm``), calibration and quantization, the rest of the
    pipeline (see the module docstring), then the per-layer errors of the result against the float32
    graph on the first ``report_samples`` calibration feeds.  ``copy``: ``graph`` belongs to the caller
    (it is copied).  ``runner``: the compile's C compiler, build cache and threads, for the calibration
    build."""
    from cuvil.ir.verify import verify
    from cuvil.log import stage
    from cuvil.passes import PassManager
    from cuvil.passes.rewrite import copy_graph
    from cuvil.quant.accuracy import layer_errors

    calib = load_calibration(dataset, graph, options)
    pre, post = pipeline.before_quantization(), pipeline.after_quantization()
    with stage(log, "passes before quantization", times):
        graph = PassManager(pre).run(copy_graph(graph) if copy else graph)
    fp32 = copy_graph(graph)
    with stage(log, "calibration and quantization", times):
        graph, qreport = post_training_quantize(graph, calib, options, runner)
    dequantize = _int8_forms(graph)
    if post:
        with stage(log, "passes after quantization", times):
            graph = PassManager(post).run(graph)
    with stage(log, "verify after passes", times):
        verify(graph)
    with stage(log, "int8 accuracy report", times):
        samples = [list(f) for f in calib.feeds[:max(report_samples, 1)]]
        layers = layer_errors(fp32, graph, samples, dequantize)
    return graph, QuantAccuracyReport(options.dtype, len(samples), layers, quantization=qreport.to_json())

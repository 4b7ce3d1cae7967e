"""The ``layerwise`` check: per-layer error of a compiled model against the source framework.

A *layer* is a value computed by a top-level node of the graph the target
actually compiles (after its passes), so the taps sit at fusion-group
boundaries: a fused conv+batch-norm+relu is one layer, its output the value
the group hands on.  The taps are built at the IR level: a copy of that graph
whose outputs include every tapped value, compiled with no passes, so the
schedule and the kernels are the ones of the untapped build.  The tapped
build's final outputs are compared bitwise with the untapped build's, so
that instrumentation is shown not to change what is measured.

Oracles, by the model's origin:

- ONNX models: onnxruntime (a copy of the model with the intermediate tensors
  added as graph outputs; Cuvil keeps ONNX tensor names);
- PyTorch modules: PyTorch eager, running the ExportedProgram Cuvil converted
  node by node (a ``torch.fx.Interpreter`` keeping every FX node's result); the
  torch front end records which FX node each value is the result of, so a
  layer names its FX node and the module path it came from;
- TensorFlow models: TensorFlow's output of each layer of the Keras model, compared with the
  tapped value of the layer's output: tf2onnx names each ONNX node after its TensorFlow op, in the
  layer's name scope, and onnxruntime on tf2onnx's model decides which value is the layer's output
  and in which layout (channels-first where tf2onnx made it so; a channels-last twin the layout
  pass made is compared in NHWC) (:func:`tensorflow_oracle`); a
  model without per-layer outputs (subclassed, a tf.function, a SavedModel) is compared with
  onnxruntime on tf2onnx's model, its layers named with their Keras layers;
- Cuvil graphs: the reference interpreter computing in float64 on the imported
  graph (values by name).

When the model's framework is not installed (an ONNX model without
onnxruntime), the oracle is the float64 reference interpreter instead, and the
result says so (``details["oracle_fallback"]`` and the summary): a missing
optional dependency changes the oracle, it does not fail the check.

Layers without an oracle value (values Cuvil introduced) are not compared.
Errors follow :mod:`cuvil.metrics`: a NaN or infinity at the same place in both
tensors is left out and the rest compared; one on one side only is an infinite
error.

For the onnxruntime subject, the layers are the tensors ORT's optimised graph
still computes (its fusion boundaries), tapped in the optimised model it saved,
and the oracle is the float64 reference interpreter.

Configuration (``[checks.layerwise]``): ``threshold`` (relative L2, default
1e-4) and ``thresholds`` (per layer value name).  The result names the first
layer, in graph order, whose error exceeds its threshold: its value, source
node, Cuvil node, op and generated-code location; ``details["series"]`` is
the per-layer error curve.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.metrics import compare
from cuvil.ops.layout import TO_NHWC
from cuvil.verify.base import Check, CheckResult, Status, VerifyError, register_check

DEFAULT_THRESHOLD = 1e-4
REFERENCE_ORACLE = "reference interpreter (float64)"
TF_ORACLE = "TensorFlow (per-layer outputs of the Keras model)"
TF_FALLBACK_ORACLE = "onnxruntime on tf2onnx's conversion"
#: the name convert-layout gives a value's channels-last twin (cuvil/passes/layout.py)
_TWIN = re.compile(r"^(.+)_nhwc(?:_\d+)?$")
#: how closely onnxruntime's value of a tensor must agree with a Keras layer's output to be taken for it
LAYOUT_MATCH = 1e-4
_FLOAT = (DType.f32, DType.f64)


@dataclass(frozen=True)
class Oracle:
    """The oracle's value of each layer by Cuvil value name, the source node of each, the oracle's name,
    and, when it is not the model's own framework because that is not installed, why."""

    values: Mapping[str, np.ndarray]
    sources: Mapping[str, str]
    name: str
    fallback: str | None = None

    @property
    def label(self) -> str:
        """The oracle as a summary names it."""
        return self.name if self.fallback is None else f"{self.name}, as {self.fallback}"


def _missing(framework: str, exc: ImportError) -> str:
    return f"{framework} is not installed ({type(exc).__name__}: {exc})"


def tap_points(graph: Graph) -> list[tuple[Node, Value]]:
    """The values a layerwise run taps, in graph order: float outputs of top-level, non-constant nodes."""
    return [(n, o) for n in graph.nodes if n.op != "constant" for o in n.outputs if o.type.dtype in _FLOAT]


def tapped_graph(graph: Graph) -> tuple[Graph, list[str]]:
    """A copy of ``graph`` whose outputs are its own followed by every tap point not already an output.

    Tapped values become outputs, so the copy's memory plan (if any) no longer holds: it is dropped,
    and the copy is compiled with :func:`tap_passes` to plan it again."""
    g = copy.deepcopy(graph)
    g.memory_plan = None
    outputs = set(g.outputs)
    extra = [o for _, o in tap_points(g) if o not in outputs]
    g.outputs = [*g.outputs, *extra]
    return g, [v.name for v in extra]


def tap_passes(graph: Graph) -> str:
    """The pipeline a tapped copy of ``graph`` is compiled with: nothing changes its nodes, but a
    memory-planned graph is planned again (its taps are graph outputs, kept out of the arena)."""
    return "plan-memory" if graph.memory_plan is not None else ""


def code_location(compiled: Any, node_name: str) -> str | None:
    """``model.c:LINE`` of the first generated line of ``node_name`` in a C or wasm32 build."""
    build = getattr(compiled, "build_info", None)
    if build is None or not build.source.is_file():
        return None
    line = build.line_of(node_name)
    if line is not None:
        return f"{build.source}:{line}"
    from cuvil.backends.c.writer import c_comment

    mark = f"/* node '{c_comment(node_name)}'"
    for i, text in enumerate(build.source.read_text(encoding="utf-8").splitlines()):
        if mark in text:
            return f"{build.source}:{i + 1}"
    return None


def onnx_intermediates(model: Any, names: Sequence[str], feed: Mapping[str, np.ndarray]
                       ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """onnxruntime's values of the tensors ``names`` the ONNX graph computes, and each one's node name."""
    import onnx
    import onnxruntime as ort

    from cuvil.frontends.onnx.loader import read_model

    proto = copy.deepcopy(read_model(model)[0])
    producers = {o: (n.name or f"{n.op_type}_{i}") for i, n in enumerate(proto.graph.node) for o in n.output if o}
    present = {o.name for o in proto.graph.output}
    wanted = [n for n in names if n in producers and n not in present]
    for name in wanted:
        proto.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3  # not its warnings about the exporter's unused initializers
    sess = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    values = sess.run(None, {i.name: feed[i.name] for i in sess.get_inputs()})
    return {n: np.asarray(v) for n, v in zip(out_names, values)}, producers


def torch_intermediates(program: Any, feed: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """PyTorch eager's result of every FX node of ``program`` (by node name) on the user inputs ``feed``
    (by placeholder name), and each node's module path (``layer1.0.conv1``; empty at top level)."""
    import torch
    from torch.export.graph_signature import InputKind

    args: list[Any] = []
    for spec in program.graph_signature.input_specs:
        name = spec.arg.name
        if spec.kind == InputKind.USER_INPUT:
            if name not in feed:
                raise VerifyError(f"the exported program's input {name!r} is not an input of the Cuvil graph")
            args.append(torch.from_numpy(np.ascontiguousarray(feed[name])))
        elif spec.target in program.state_dict:
            args.append(program.state_dict[spec.target])
        elif spec.target in program.constants:
            args.append(program.constants[spec.target])
        else:
            raise VerifyError(f"the exported program's input {name!r} ({spec.kind.name}) has no value")
    values: dict[str, np.ndarray] = {}

    class Tap(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n.op == "call_function" and isinstance(out, torch.Tensor):
                values[n.name] = out.detach().numpy().copy()
            return out

    with torch.no_grad():
        Tap(program.graph_module).run(*args)
    modules = {}
    for n in program.graph.nodes:
        stack = list((n.meta.get("nn_module_stack") or {}).values())
        path = str(stack[-1][0]) if stack else ""
        modules[n.name] = "" if path.startswith("_empty") else path
    return values, modules


def _channels_first(rank: int) -> tuple[int, ...]:
    """The permutation from channels-last to channels-first (NHWC -> NCHW) at ``rank``."""
    return (0, rank - 1, *range(1, rank - 1))


def tensorflow_oracle(imp: Any, names: Sequence[str], feed: Mapping[str, np.ndarray],
                      inputs: Sequence[np.ndarray]) -> Oracle:
    """TensorFlow's own output of each Keras layer, for the tapped values that compute it.

    A value is matched to a layer by its ONNX node (tf2onnx names it after the TensorFlow op, in the
    layer's name scope), and is that layer's output, in TensorFlow's layout or channels-first, when
    onnxruntime's value of it on tf2onnx's model agrees with the layer's output (relative L2 within
    :data:`LAYOUT_MATCH`) in that layout: the layout and the match are decided by the two
    frameworks, never by the build under test.  Values inside a layer (not its output) and layers
    tf2onnx merged away have no oracle value and are not compared.  Without per-layer outputs (a
    subclassed model, a tf.function, a SavedModel) the oracle is onnxruntime on tf2onnx's model."""
    from cuvil.frontends.tensorflow.layers import layer_outputs

    twins = {n: m.group(1) for n in names if (m := _TWIN.match(n))}
    ort, producers = onnx_intermediates(imp.onnx_model, [*names, *twins.values()], feed)
    per_layer = layer_outputs(imp.keras_model, inputs) if imp.keras_model is not None else {}
    if not per_layer:
        scopes = {v: (f"{n} (Keras layer {imp.layers[n]})" if n in imp.layers else n) for v, n in producers.items()}
        return Oracle(ort, scopes, TF_FALLBACK_ORACLE)
    values: dict[str, np.ndarray] = {}
    sources: dict[str, str] = {}
    for v, a in ort.items():
        layer = imp.layers.get(producers.get(v, ""))
        want = per_layer.get(layer) if layer is not None else None
        if want is None or a.dtype.kind != "f":
            continue
        best: tuple[float, np.ndarray] | None = None
        for perm in [tuple(range(want.ndim)), *([_channels_first(want.ndim)] if want.ndim >= 3 else [])]:
            cand = np.ascontiguousarray(want.transpose(perm))
            if cand.shape == a.shape:
                err = compare(a, cand).rel_l2
                if err <= LAYOUT_MATCH and (best is None or err < best[0]):
                    best = (err, cand)
        if best is not None:
            values[v] = best[1]
            sources[v] = f"Keras layer {layer} ({producers[v]})"
    for twin, base in twins.items():  # the layout pass's channels-last twin of a matched value
        if base in values and values[base].ndim == 4:
            values[twin] = np.ascontiguousarray(values[base].transpose(TO_NHWC))
            sources[twin] = sources[base]
    return Oracle(values, sources, TF_ORACLE)


def reference_intermediates(graph: Graph, inputs: Sequence[np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every top-level value of ``graph`` by name, computed by the reference interpreter in float64."""
    from cuvil.backends.ref.interpreter import run_graph
    from cuvil.verify.widen import widen_graph

    wide = widen_graph(graph)
    values: dict[str, np.ndarray] = {}
    producers: dict[str, str] = {}

    top = set(id(n) for n in wide.nodes)

    def hook(node: Node, outs: list[np.ndarray]) -> None:
        if id(node) in top:
            for v, a in zip(node.outputs, outs):
                values[v.name] = a
                producers[v.name] = node.name

    args = [a.astype(np.float64) if a.dtype == np.float32 else a for a in inputs]
    finals = run_graph(wide, args, on_node=hook)
    values.update({v.name: a for v, a in zip(wide.outputs, finals)})
    return values, producers


@register_check
class Layerwise(Check):
    """Per-layer relative L2 error between each compiled target and the source framework."""

    name = "layerwise"
    group = "runtime"
    description = "per-layer error against the source framework, at fusion-group boundaries"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx)
        threshold = float(cfg.get("threshold", DEFAULT_THRESHOLD))
        per_layer = {str(k): float(v) for k, v in dict(cfg.get("thresholds", {})).items()}
        inputs = ctx.inputs()
        oracles: dict[str, Oracle] = {}
        results = []
        for target in ctx.targets:
            t0 = time.perf_counter()
            base = ctx.compiled(target)
            if callable(getattr(base, "tapped", None)):
                layers, got, changed, oracle = self._session(ctx, base, inputs, oracles)
            elif base.graph is None:
                results.append(CheckResult(self.name, Status.SKIP, "the build keeps no graph to tap", target=target))
                continue
            else:
                layers, got, changed, oracle = self._build(ctx, target, base, inputs, oracles)
            result = self._judge(target, layers, got, changed, oracle, threshold, per_layer, base)
            result.seconds = time.perf_counter() - t0
            results.append(result)
        return results

    def _oracle(self, ctx: Any, names: Sequence[str], inputs: Sequence[np.ndarray],
                cache: dict[str, Oracle], *, framework: bool = True) -> Oracle:
        """The oracle's values of the layers (``framework=False``: the float64 reference even for an
        ONNX model, as onnxruntime is the subject).  A source framework that is not installed is not
        an error: the float64 reference interpreter is the oracle, and the result says why."""
        ref = ctx.compiled("ref")
        kind = ctx.source.kind
        feed = dict(zip(ref.input_names, inputs))
        if kind == "onnx" and framework:
            if "onnx-fallback" not in cache:  # onnxruntime is asked again for each target's tap names
                try:
                    values, producers = onnx_intermediates(ctx.source.model, names, feed)
                    return Oracle(values, producers, "onnxruntime")
                except ImportError as exc:
                    cache["onnx-fallback"] = self._reference(ctx, inputs, _missing("onnxruntime", exc))
            return cache["onnx-fallback"]
        if kind == "tensorflow" and framework:
            if "tf-fallback" not in cache:
                try:
                    return tensorflow_oracle(ctx.tensorflow_import, names, feed, list(inputs))
                except ImportError as exc:
                    cache["tf-fallback"] = self._reference(ctx, inputs, _missing("onnxruntime", exc))
            return cache["tf-fallback"]
        if "all" not in cache:
            if kind == "torch":
                try:
                    imp = ctx.torch_import
                    fx, modules = torch_intermediates(imp.program, feed)
                except ImportError as exc:
                    cache["all"] = self._reference(ctx, inputs, _missing("PyTorch", exc))
                else:
                    values = {v: fx[n] for v, n in imp.value_sources.items() if n in fx}
                    sources = {v: (f"{n} ({modules[n]})" if modules.get(n) else n) for v, n in imp.value_sources.items()}
                    cache["all"] = Oracle(values, sources, "PyTorch eager")
            else:
                cache["all"] = self._reference(ctx, inputs)
        return cache["all"]

    @staticmethod
    def _reference(ctx: Any, inputs: Sequence[np.ndarray], fallback: str | None = None) -> Oracle:
        values, producers = reference_intermediates(ctx.graph, inputs)
        return Oracle(values, producers, REFERENCE_ORACLE, fallback)

    def _build(self, ctx: Any, target: str, base: Any, inputs: list[np.ndarray],
               cache: dict[str, Oracle]) -> tuple[Any, ...]:
        """A Cuvil build tapped at its top-level nodes' outputs (the graph compiled with no passes)."""
        import cuvil

        graph = base.graph
        tapped_g, extra = tapped_graph(graph)
        tapped = cuvil.compile(tapped_g, target=target, options=ctx.compile_options(target, passes=tap_passes(graph)))
        plain_out = [np.asarray(a) for a in base(*inputs)]
        tapped_out = [np.asarray(a) for a in tapped(*inputs)]
        n_out = len(graph.outputs)
        changed = [graph.outputs[i].name for i in range(n_out)
                   if plain_out[i].shape != tapped_out[i].shape or plain_out[i].tobytes() != tapped_out[i].tobytes()]
        got = {v.name: a for v, a in zip(graph.outputs, plain_out)}
        got.update(zip(extra, tapped_out[n_out:]))
        points = tap_points(graph)
        oracle = self._oracle(ctx, [v.name for _, v in points], inputs, cache)
        layers = [(v.name, n.name, n.op, oracle.sources.get(v.name)) for n, v in points]
        return layers, got, changed, oracle

    def _session(self, ctx: Any, base: Any, inputs: list[np.ndarray], cache: dict[str, Oracle]) -> tuple[Any, ...]:
        """A runtime session tapped at the tensors its optimised graph computes (the onnxruntime subject)."""
        oracle = self._oracle(ctx, [], inputs, cache, framework=False)
        floats = {v.name for v in ctx.graph.outputs} | {v.name for _, v in tap_points(ctx.graph)}
        computed = [(t, node, op) for t, node, op in base.computed_tensors() if t in floats and t in oracle.values]
        sess, out_names = base.tapped([t for t, _, _ in computed])
        feed = dict(zip(base.input_names, inputs))
        tapped_out = dict(zip(out_names, (np.asarray(a) for a in sess.run(None, feed))))
        plain_out = dict(zip(base.output_names, base(*inputs)))
        changed = [n for n, a in plain_out.items() if a.shape != tapped_out[n].shape or a.tobytes() != tapped_out[n].tobytes()]
        layers = [(t, node, op, oracle.sources.get(t)) for t, node, op in computed]
        return layers, {**tapped_out, **plain_out}, changed, oracle

    def _judge(self, target: str, layers: Sequence[tuple[str, str, str, str | None]], got: Mapping[str, np.ndarray],
               changed: list[str], oracle: Oracle, threshold: float, per_layer: Mapping[str, float], base: Any
               ) -> CheckResult:
        oracle_name = oracle.label
        series: list[dict[str, Any]] = []
        first: dict[str, Any] | None = None
        for value, node, op, source in layers:
            if value not in oracle.values or value not in got:
                continue
            want = oracle.values[value]
            mine = got[value]
            c = compare(mine, want)
            err = c.rel_l2
            limit = per_layer.get(value, threshold)
            entry = {
                "layer": len(series), "value": value, "source_node": source, "cuvil_node": node, "op": op,
                "rel_l2": err, "max_abs": c.max_abs, "threshold": limit, "shape": list(mine.shape),
            }
            if c.problem is not None:
                entry["problem"] = c.problem
            series.append(entry)
            if first is None and not err <= limit:
                first = entry
        figures = {"layers": float(len(series)),
                   "max_rel_l2": max((e["rel_l2"] for e in series), default=0.0),
                   "tap_mismatches": float(len(changed))}
        details: dict[str, Any] = {"series": series, "oracle": oracle.name, "tapped_values": len(layers),
                                   "tap_changed_outputs": changed}
        if oracle.fallback is not None:
            details["oracle_fallback"] = oracle.fallback
        where: dict[str, str] = {}
        tensors: dict[str, np.ndarray] = {}
        node_kind = "Cuvil node" if base.graph is not None else f"{target} node"
        if first is not None:
            loc = code_location(base, first["cuvil_node"]) if base.graph is not None else None
            where = {"layer": first["value"], "node": first["cuvil_node"], "op": first["op"],
                     "source_node": str(first["source_node"])}
            if loc:
                where["code"] = loc
            tensors = {f"{first['value']}.compiled": got[first["value"]], f"{first['value']}.oracle": oracle.values[first["value"]]}
            at = f", {loc}" if loc else ""
            status, summary = Status.FAIL, (
                f"layer {first['layer']} ({first['value']!r}, source node {first['source_node']!r}, {node_kind} "
                f"{first['cuvil_node']!r} {first['op']}{at}) has relative L2 error {first['rel_l2']:.3g} > "
                f"{first['threshold']:.3g} against {oracle_name}")
        elif changed:
            status = Status.FAIL
            summary = f"adding taps changed the outputs {changed}: the tapped build does not match the untapped one"
            where = {"output": changed[0]}
        elif not series:
            status, summary = Status.SKIP, f"no layer has a value to compare in {oracle_name}"
        else:
            status = Status.PASS
            summary = (f"{len(series)} layers within their thresholds against {oracle_name} "
                       f"(largest relative L2 {figures['max_rel_l2']:.3g}); taps leave the outputs bitwise unchanged")
        return CheckResult(self.name, status, summary, target=target, figures=figures, details=details, where=where,
                           tensors=tensors)

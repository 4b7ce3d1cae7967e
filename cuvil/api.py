"""The public entry point: ``cuvil.compile``."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node
from cuvil.ir.types import SymbolInfo
from cuvil.ir.verify import verify
from cuvil.log import stage
from cuvil.options import CompileOptions
from cuvil.runtime.compiled import BuildExecutor, CompiledModel, CompileInfo, Signature

if TYPE_CHECKING:
    from cuvil.backends.registry import Backend
    from cuvil.pipeline import Pipeline

_log = logging.getLogger(__name__)


class multiple_of:  # noqa: N801  (reads as a constraint: dims={"h": multiple_of(32)})
    """A constraint that a symbolic dim is a multiple of ``n``."""

    def __init__(self, n: int, min: int | None = None, max: int | None = None) -> None:
        if n <= 0:
            raise ValueError("multiple_of needs a positive number")
        self.n, self.min, self.max = n, min, max


DimConstraint = tuple[int | None, int | None] | multiple_of | int


def constraint_info(name: str, c: DimConstraint) -> SymbolInfo:
    """The SymbolInfo a ``dims=`` entry describes: ``(lo, hi)``, ``multiple_of(n)`` or a fixed int."""
    if isinstance(c, multiple_of):
        info = SymbolInfo(name, c.min, c.max, c.n)
    elif isinstance(c, int):
        info = SymbolInfo(name, c, c)
    else:
        lo, hi = c
        info = SymbolInfo(name, lo, hi)
    if info.min is not None and info.max is not None and info.min > info.max:
        raise CuvilError(f"dims: {name} has minimum {info.min} above maximum {info.max}")
    return info


def apply_dims(graph: Graph, dims: Mapping[str, DimConstraint]) -> None:
    """Constrain the graph's symbols (each must exist in the graph)."""
    for name, c in dims.items():
        if name not in graph.symbols:
            known = ", ".join(sorted(graph.symbols)) or "none"
            raise CuvilError(f"dims: the model has no symbolic dim {name!r} (its symbols: {known})")
        graph.symbols[name] = constraint_info(name, c)


def import_model(model: Any, dims: Mapping[str, DimConstraint] | None = None) -> Graph:
    """Any supported model form as a Cuvil graph, its symbols constrained by ``dims``.

    Constraints are known while the model is imported, so shape inference can use them."""
    if isinstance(model, Graph):
        graph = model
    elif _is_tensorflow(model):
        from cuvil.frontends.tensorflow import load_tensorflow

        graph = load_tensorflow(model, None, {k: constraint_info(k, c) for k, c in (dims or {}).items()}).graph
    else:
        from cuvil.frontends.onnx import load_onnx

        graph = load_onnx(model, symbols={k: constraint_info(k, c) for k, c in (dims or {}).items()})
    if dims:
        apply_dims(graph, dims)
    return graph


def compile(  # noqa: A001  (the library's main verb)
    model: Any,
    target: str = "ref",
    options: CompileOptions | None = None,
    **overrides: Any,
) -> CompiledModel:
    """Compile a model for ``target``: an ONNX path, bytes or ModelProto, a Cuvil Graph, a PyTorch
    ``nn.Module`` (in eval mode) or ``ExportedProgram``, or a TorchScript model: a scripted or traced
    module or function, or the path of a ``.pt``/``.pth`` file ``torch.jit.save`` wrote (PyTorch and
    TorchScript models take ``input_spec=``), or a TensorFlow model: a Keras model, a ``tf.function``
    with an input signature, a SavedModel (loaded, or its folder's path) or a ``.keras`` file
    (``input_spec=``: ``tf.TensorSpec``s with None for dynamic dims, ``cuvil.TensorSpec``s or example
    arrays; cuvil.frontends.tensorflow).

    ``target`` is a registered backend's name (``cuvil.backends.registry.backend_names()``: ref,
    generic, x86_avx2, x86_avx512, native, wasm32).  ``options`` is a :class:`cuvil.CompileOptions`
    (its docstring says what every option does), and ``overrides`` its keyword spelling
    (``input_spec=``, ``enable_fusion=``, ``precision=``, ``quant_dtype=``, ``calibration_dataset=``,
    ``num_threads=``, ``cc=`` ...: ``cuvil.options.KEYWORDS``), which replaces those fields of
    ``options``; an unknown keyword is a ``CompileOptionError`` naming it.  The options are checked
    for the target in one place (``cuvil.options.validate``), the pipeline comes from
    ``cuvil.pipeline.build_pipeline``, and the target's backend builds the result."""
    from cuvil.backends.registry import backends, get_backend
    from cuvil.options import validate

    backend = get_backend(target)
    opts = (options if options is not None else CompileOptions()).with_overrides(**overrides)
    validate(opts, backend, backends())
    t0 = time.perf_counter()
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    times: dict[str, float] = {}
    quantized = opts.quantization.dtype is not None
    notes = ([f"enable_fusion: the {target} target runs the graph as imported (no passes), so nothing is fused"]
             if opts.enable_fusion and not backend.default_pipeline() and opts.passes is None and not quantized
             else [])
    dims = opts.dims
    with stage(_log, "import", times):
        if _is_tensorflow(model):
            from cuvil.frontends.tensorflow import load_tensorflow

            if opts.dynamic_shapes is not None:
                raise CuvilError("dynamic_shapes applies to PyTorch models; a TensorFlow model's dynamic dims are the "
                                 "None dims of its tf.TensorSpecs (or the symbols of cuvil.TensorSpecs) in input_spec")
            tf_import = load_tensorflow(model, opts.input_spec, {k: constraint_info(k, c) for k, c in (dims or {}).items()})
            graph, kind, digest = tf_import.graph, tf_import.kind, tf_import.sha256
            if dims:
                apply_dims(graph, dims)
        elif _is_torch_model(model) or _is_torch_file(model):
            from cuvil.frontends.torch import load_torch

            imported = load_torch(model, opts.input_spec, opts.dynamic_shapes,
                                  {k: constraint_info(k, c) for k, c in (dims or {}).items()})
            graph, kind, digest = imported.graph, imported.kind, imported.sha256
        elif opts.input_spec is not None or opts.dynamic_shapes is not None:
            raise CuvilError("input_spec and dynamic_shapes apply to PyTorch models (TorchScript ones among them) and "
                             "input_spec to TensorFlow ones; constrain the symbolic dims of other models with dims=")
        else:
            graph = import_model(model, dims)
            kind, digest = source_digest(model, graph)
    with stage(_log, "verify", times):
        verify(graph)
    with stage(_log, "shape checks", times):
        signature = Signature.of(graph, opts.faults)
    if backend.is_c and opts.faults:  # a planted call-path fault applies to C builds (cuvil/faults.py)
        from cuvil.faults import call_fault

        signature = dataclasses.replace(signature, call_fault=call_fault(opts.faults))
    if quantized and opts.quantization.reduce_range is None:
        opts = _reduce_range(opts, backend)
    from cuvil.pipeline import build_pipeline, precision_pass

    pipeline = build_pipeline(backend, opts)
    int8 = None
    if quantized:
        graph, int8 = _quantize(graph, graph is model, pipeline, opts, times)
    fp32_graph = None
    converted = precision_pass(opts.precision) is not None
    if converted:
        from cuvil.passes.rewrite import copy_graph

        fp32_graph = copy_graph(graph)
    if not quantized:
        try:
            graph = _run_passes(graph, model, pipeline, times)
        except CuvilError as exc:
            from cuvil.passes.convert_precision import PrecisionOverflowError

            if isinstance(exc.__cause__, PrecisionOverflowError):  # the user's error, not the pipeline's
                raise exc.__cause__ from None
            raise
    report = None
    if converted and fp32_graph is not None:
        report = _precision_report(fp32_graph, graph, opts, times, notes)
    if int8 is not None:
        report = int8
    _log_plan(graph, backend, signature)
    executor = backend.build(graph, opts, build_key=opts.build_key(pipeline.text), times=times)
    cached = executor.build_info(target).cached if isinstance(executor, BuildExecutor) else None
    info = CompileInfo(graph.name, kind, digest, time.perf_counter() - t0, cached, at, tuple(notes),
                       None if report is None else report.to_json())
    m = CompiledModel(signature, executor, target, graph, info)
    cache = {None: "no build", True: "build cache hit", False: "built"}[m.info.cached]
    ops = [n.op for n in graph.walk()]
    _log.info("compiled %r for %s: %d nodes (+%d constants), %d inputs, %d outputs, %d run-time shape checks, "
              "%.3f s (%s)", graph.name, target, len(ops) - ops.count("constant"), ops.count("constant"),
              len(graph.inputs), len(graph.outputs), len(signature.checks), m.info.seconds or 0.0, cache)
    return m


def _reduce_range(options: CompileOptions, backend: Backend) -> CompileOptions:
    """``reduce_range=None`` resolved for the target: 7-bit weights where its int8 kernels gain from them."""
    reduce_range = backend.reduce_range_default()
    if reduce_range:
        _log.info("int8 weights in [-64, 64] (reduce_range): on %s the int8 kernels multiply 7-bit weights "
                  "with vpmaddubsw, exactly and faster than 8-bit ones; reduce_range=False keeps "
                  "[-127, 127]", backend.name)
    return options.with_overrides(reduce_range=reduce_range)


def _quantize(graph: Graph, copy: bool, pipeline: Pipeline, options: CompileOptions,
              times: dict[str, float]) -> tuple[Graph, Any]:
    """Post-training quantization around calibration, splitting ``pipeline`` (cuvil/quant/ptq.py); its
    calibration build uses the compile's ``cc``, ``cache_dir`` and ``num_threads``."""
    from cuvil.quant.calibrate import RunnerOptions
    from cuvil.quant.ptq import QuantOptions, compile_int8

    q, b = options.quantization, options.build
    assert q.dtype is not None
    quant = QuantOptions(q.dtype, q.symmetric, q.per_channel, q.calibration, min_samples=q.min_samples,
                         reduce_range=q.reduce_range if q.reduce_range is not None else False)
    return compile_int8(graph, copy, pipeline, q.dataset, quant, options.precision.samples, times,
                        RunnerOptions(cc=b.cc, cache_dir=b.cache_dir, num_threads=b.num_threads,
                                       faults=options.faults))


def _precision_report(fp32_graph: Graph, graph: Graph, options: CompileOptions, times: dict[str, float],
                      notes: list[str]) -> Any:
    """The reduced-precision graph against the float32 one on the sample inputs (overflows refused
    unless ``allow_overflow``; allowed ones logged and noted)."""
    from cuvil.quant.accuracy import check_reduced_precision, sample_inputs
    from cuvil.quant.calibrate import RunnerOptions
    from cuvil.quant.data import calibration_items, calibration_set

    p, b = options.precision, options.build
    dataset = options.quantization.dataset
    with stage(_log, "precision report", times):
        calib = None
        if dataset is None:
            samples = sample_inputs(fp32_graph, None, p.samples)
        else:  # every example is checked (the input contract, then fp16 overflow), not only the samples
            items = calibration_items(dataset, fp32_graph)
            checked = sample_inputs(fp32_graph, items, len(items))
            samples = checked[:p.samples]
            # examples beyond the report's samples are searched for overflows on a calibration build; when
            # the samples are every example, the report's own run sees them all and no build is needed
            calib = calibration_set(checked, fp32_graph) if len(checked) > len(samples) else None
        report = check_reduced_precision(fp32_graph, graph, samples, p.dtype, dict(p.overrides or {}),
                                         p.allow_overflow, calib,
                                         RunnerOptions(cc=b.cc, cache_dir=b.cache_dir, num_threads=b.num_threads,
                                                       faults=options.faults))
    for o in report.overflows:
        _log.warning("precision=%s: %s (allowed by allow_overflow=True)", p.dtype, o.describe())
        notes.append(f"allow_overflow: {o.describe()}")
    from cuvil.ir.dtypes import DType, max_finite
    from cuvil.options import PRECISION_ALIASES
    from cuvil.passes.convert_precision import mask_fills

    low = DType(PRECISION_ALIASES[p.dtype.lower()])
    for name, how in mask_fills(fp32_graph, low).constants.items():
        notes.append(f"mask fill: constant {name!r} ({how}) is beyond {low}'s range; set to {low}'s finite "
                     f"extreme of its sign (+-{max_finite(low):g}), as onnxruntime's float16 converter does (not -inf: "
                     "0 * -inf and a fully masked row would give NaN where float32 gives 0 and uniform weights)")
    return report


def _run_passes(graph: Graph, model: Any, pipeline: Pipeline, times: dict[str, float]) -> Graph:
    """The graph after the pass pipeline (verified again: the backends take only valid IR)."""
    from cuvil.passes.rewrite import copy_graph

    manager = pipeline.pass_manager()
    if not manager.passes:
        return graph
    _log.debug("pass pipeline: %s", manager.pipeline)
    with stage(_log, "passes", times):
        graph = manager.run(copy_graph(graph) if graph is model else graph)
    with stage(_log, "verify after passes", times):
        verify(graph)
    return graph


def _is_torch_model(model: Any) -> bool:
    # a torch model exists only once torch is loaded: ONNX users never import the torch front end
    if "torch" not in sys.modules:
        return False
    from cuvil.frontends.torch.export import is_torch_model

    return is_torch_model(model)


def _is_tensorflow(model: Any) -> bool:
    # a SavedModel folder or .keras file (a zip archive: checked before the torch files), or a Keras or
    # tf.function object, which exists only once its framework is loaded
    from cuvil.frontends.tensorflow import is_tensorflow_model, is_tensorflow_path

    return is_tensorflow_path(model) or is_tensorflow_model(model)


def _is_torch_file(model: Any) -> bool:
    # a path to a zip archive or a .pt/.pth file: read by the torch front end (a TorchScript archive or refused)
    from cuvil.frontends.torch_file import is_torch_file

    return is_torch_file(model)


def _log_plan(graph: Graph, backend: Backend, signature: Signature) -> None:
    """DEBUG: how the graph is split (partitions, fusion groups) and the shape relations left to run time."""
    if not _log.isEnabledFor(logging.DEBUG):
        return
    from cuvil.ops.fused import FUSED_OPS
    from cuvil.passes.fuse_elementwise import group_ops

    def kernels(g: Graph) -> Iterator[Node]:  # a fused node's region is part of its one kernel
        for n in g.nodes:
            yield n
            if n.op not in FUSED_OPS:
                for _, r in n.regions():
                    yield from kernels(r)

    nodes = [n for n in kernels(graph) if n.op != "constant"]
    # layout changes the passes could not cancel (an NHWC model's edges, ops that read NCHW only)
    transposes = [n for n in nodes if n.op == "transpose"]
    _log.debug("transposes left after the passes: %d%s", len(transposes),
               "".join(f"\n  node {n.name!r}: perm {n.attrs.get('perm')} on {n.inputs[0].type if n.inputs[0] else '?'}"
                       for n in transposes))
    interpreted = backend.kernel_ops() is None  # it runs each op's NumPy reference
    where = "the reference interpreter" if interpreted else f"the {backend.name} code generator"
    _log.debug("partitions: 1 (the whole graph: %d nodes besides constants, on %s)", len(nodes), where)
    fused = sum(1 for n in nodes if n.op in FUSED_OPS)
    _log.debug("fusion groups: %d (%d fused nodes; every other node is a group of its own)", len(nodes), fused)
    for i, n in enumerate(nodes):
        what = f"{n.op}: {', '.join(group_ops(n))}" if n.op in FUSED_OPS else n.op
        _log.debug("fusion group %d: node %r (%s)", i, n.name, what)
    for chk in signature.checks:
        _log.debug("shape check at run time: %s needs %s (%s)", chk.where(), chk.describe(), chk.what)
    if interpreted:
        from cuvil.ops.registry import get

        for n in nodes:
            ref = get(n.op).reference
            impl = f"{ref.__module__}.{ref.__name__}" if ref is not None else "the interpreter itself (control flow)"
            _log.debug("node %r (%s): NumPy reference %s", n.name, n.op, impl)


def source_digest(model: Any, graph: Graph) -> tuple[str, str]:
    """What kind of model was compiled, and the sha256 of its bytes (a file's, a ModelProto's, or the IR text).

    For a model with external data, the hash covers the .onnx file, not the data files beside it."""
    if isinstance(model, Graph):
        from cuvil.ir.printer import print_graph

        return "cuvil graph", hashlib.sha256(print_graph(graph).encode()).hexdigest()
    if isinstance(model, str | os.PathLike):
        h = hashlib.sha256()
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return "onnx file", h.hexdigest()
    if isinstance(model, bytes):
        return "onnx bytes", hashlib.sha256(model).hexdigest()
    return "onnx model", hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()

"""The public entry point: ``cuvil.compile``."""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node
from cuvil.ir.types import SymbolInfo
from cuvil.ir.verify import verify
from cuvil.log import stage
from cuvil.runtime.compiled import CompiledModel, CompileInfo, Signature

if TYPE_CHECKING:
    from cuvil.passes import Pass, PassManager

_log = logging.getLogger(__name__)

TARGETS = ("ref", "generic", "x86_avx2", "x86_avx512", "native", "wasm32")


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
    else:
        from cuvil.frontends.onnx import load_onnx

        graph = load_onnx(model, symbols={k: constraint_info(k, c) for k, c in (dims or {}).items()})
    if dims:
        apply_dims(graph, dims)
    return graph


def compile(  # noqa: A001  (the library's main verb)
    model: Any,
    target: str = "ref",
    *,
    dims: Mapping[str, DimConstraint] | None = None,
    cache_dir: str | None = None,
    cc: str | None = None,
    sanitize: bool = False,
    input_spec: Any = None,
    dynamic_shapes: Any = None,
    enable_fusion: bool = True,
    num_threads: int | None = None,
    passes: str | Sequence[Pass] | PassManager | None = None,
    precision: str = "fp32",
    precision_overrides: Mapping[str, str] | None = None,
    allow_overflow: bool = False,
    calibration_dataset: Any = None,
    precision_samples: int = 2,
    conv_algorithm: str | Mapping[str, str] | None = None,
    quant_dtype: str | None = None,
    symmetric: bool = True,
    per_channel: bool = True,
    calibration: str = "minmax",
    min_calibration_samples: int | None = None,
    reduce_range: bool | None = None,
) -> CompiledModel:
    """Compile a model for ``target``: an ONNX path, bytes or ModelProto, a Cuvil Graph, or a PyTorch
    ``nn.Module`` (in eval mode) or ``ExportedProgram``.

    A PyTorch module is exported with ``torch.export`` for ``input_spec`` (example tensors or
    ``cuvil.TensorSpec`` objects, in a list for positional inputs or a dict for keyword inputs) and
    ``dynamic_shapes`` (torch.export's convention: ``{"x": {0: torch.export.Dim("batch", min=1, max=64)}}``).
    ``dims`` constrains symbolic dims by name for every kind of model.  ``enable_fusion`` asks for
    operator fusion (the fusion passes of the default pipeline; ``ref`` runs no passes, which
    ``m.info.notes`` records).  ``num_threads``: the
    threads each call of a native C target splits its large kernels over (None: the physical cores this
    process may use; 1: no worker threads); results are bitwise the same for any number.

    ``passes`` is the pass pipeline run on the imported graph: pipeline text
    (``"canonicalize,fold-constants,cse,dce"``), a list of ``cuvil.passes.Pass`` objects, or a
    ``cuvil.passes.PassManager`` (with instruments and a limit; its ``report`` is filled in).
    ``None`` runs the target's default pipeline (``cuvil.passes.default_pipeline``), ``""`` none.
    A Cuvil Graph given as ``model`` is copied first, never changed.

    ``conv_algorithm`` (C and wasm32 targets) picks how convolutions run: "auto" (default: a cost
    model per node), "im2col" (the GEMM-based kernels), "winograd" (Winograd, tile size by the cost
    model), "winograd-f2" / "winograd-f4" / "winograd-f6" (F(2x2,3x3), F(4x4,3x3), F(6x6,3x3)), for
    every convolution it applies to, or per node: ``{"layer1.0.conv1": "winograd-f4", ...}`` (a
    node not named keeps "auto").  Winograd applies to f32 2-D 3x3 convolutions with unit strides
    and dilations and one group; naming a node that is not such a convolution of the compiled graph,
    or an unknown algorithm, is a ``ConvAlgorithmError`` (docs/conv-algorithms.md).

    ``precision`` ("fp32", "fp16" or "bf16") stores weights and computes in that type, accumulating
    GEMM, matmul and convolution in float32 and keeping numerically sensitive ops (softmax,
    normalisations, summing reductions, exp/log ...) in float32: the ``convert-precision`` pass,
    run before fusion.  ``precision_overrides`` maps an op name or ``node:NAME`` to "fp32" or the
    reduced type (``{"softmax": "fp16", "node:encoder.0.attn": "fp32"}``; a node's entry wins).
    The float32 graph and the converted one then run in the reference interpreter on
    ``precision_samples`` inputs (the first samples of ``calibration_dataset`` when given, else
    seeded random ones): a value that overflows the reduced type there, or (fp16) on any example of
    ``calibration_dataset`` (its float32 ranges taken on a native calibration build), is refused with
    a ``PrecisionOverflowError`` naming the node, op and value, unless ``allow_overflow``; the
    per-layer errors are kept in ``m.info.precision`` (saved with the model; ``cuvil inspect
    --precision`` prints the worst layers).

    ``quant_dtype="int8"`` quantizes after calibration on ``calibration_dataset`` (a DataLoader, an
    iterable of input tuples or dicts, or a folder of .npz files; at least 64 examples unless
    ``min_calibration_samples`` says otherwise): conv, gemm and matmul get int8 weights per output
    channel (``per_channel``) and activations per tensor, int8 with zero point 0 (``symmetric``) or
    uint8 with a zero point, their ranges from ``calibration`` ("minmax", "percentile", "entropy").
    The quantize/dequantize nodes are explicit in the IR, inserted after ``fold-batchnorm`` and
    before fusion (``cuvil/quant/ptq.py``); ``m.info.precision`` records the per-layer errors
    against the float32 graph on ``precision_samples`` calibration inputs, every tensor's scale and
    zero point, and the warnings (also logged on ``cuvil.quant``).  ``reduce_range`` quantizes weights
    to ``[-64, 64]`` (7 bits) instead of ``[-127, 127]``; ``None`` (default) does so where the
    target's int8 kernels gain from it: AVX2 without AVX-512 (``x86_avx2``, or ``native`` on such a
    CPU) multiplies 7-bit weights with vpmaddubsw, exactly and faster than 8-bit ones (1.2 to 1.3x end
    to end on CNNs, measured on AMD Zen 3).
    The choice is logged and recorded in ``m.info.precision``, whose per-layer errors include it."""
    if target not in TARGETS:
        raise CuvilError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    if num_threads is not None:
        from cuvil.backends.c.library import check_num_threads

        check_num_threads(num_threads)
    from cuvil.backends.c.kernels.conv_algorithm import normalize as _conv_algorithm

    conv_choice = _conv_algorithm(conv_algorithm)
    if conv_choice != "auto" and target == "ref":
        raise CuvilError("conv_algorithm applies to the C and wasm32 targets; ref runs the reference interpreter")
    if num_threads is not None and target in ("ref", "wasm32") and num_threads != 1:
        raise CuvilError(f"num_threads applies to the native C targets; {target} runs one thread")
    t0 = time.perf_counter()
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    times: dict[str, float] = {}
    notes = (["enable_fusion: the ref target runs the graph as imported (no passes), so nothing is fused"]
             if enable_fusion and target == "ref" and passes is None else [])
    with stage(_log, "import", times):
        if _is_torch_model(model):
            from cuvil.frontends.torch import load_torch

            imported = load_torch(model, input_spec, dynamic_shapes,
                                  {k: constraint_info(k, c) for k, c in (dims or {}).items()})
            graph, kind, digest = imported.graph, "pytorch module", imported.sha256
        elif input_spec is not None or dynamic_shapes is not None:
            raise CuvilError("input_spec and dynamic_shapes apply to PyTorch models; constrain the symbolic "
                             "dims of other models with dims=")
        else:
            graph = import_model(model, dims)
            kind, digest = source_digest(model, graph)
    with stage(_log, "verify", times):
        verify(graph)
    with stage(_log, "shape checks", times):
        signature = Signature.of(graph)
    int8 = None
    if quant_dtype is not None:
        graph, int8 = _quantize(graph, model, target, passes, enable_fusion, precision, calibration_dataset,
                                precision_samples, times, quant_dtype, symmetric, per_channel, calibration,
                                min_calibration_samples, cc, cache_dir, num_threads, reduce_range)
        passes = ""  # the whole pipeline ran, around calibration
        notes = [n for n in notes if not n.startswith("enable_fusion")]  # passes did run, on ref too
    convert = _precision_pass(precision, precision_overrides)
    fp32_graph = None
    if convert is not None:
        from cuvil.passes.rewrite import copy_graph

        fp32_graph = copy_graph(graph)
    try:
        graph = _run_passes(graph, model, target, passes, enable_fusion, times, convert)
    except CuvilError as exc:
        from cuvil.passes.convert_precision import PrecisionOverflowError

        if isinstance(exc.__cause__, PrecisionOverflowError):  # the user's error, not the pipeline's
            raise exc.__cause__ from None
        raise
    report = None
    if convert is not None and fp32_graph is not None:
        from cuvil.quant.accuracy import check_reduced_precision, sample_inputs

        with stage(_log, "precision report", times):
            from cuvil.quant.calibrate import RunnerOptions
            from cuvil.quant.data import calibration_items, calibration_set

            calib = None
            if calibration_dataset is None:
                samples = sample_inputs(fp32_graph, None, precision_samples)
            else:  # every example is checked (the input contract, then fp16 overflow), not only the samples
                items = calibration_items(calibration_dataset, fp32_graph)
                checked = sample_inputs(fp32_graph, items, len(items))
                calib = calibration_set(checked, fp32_graph)
                samples = checked[:precision_samples]
            report = check_reduced_precision(fp32_graph, graph, samples, precision,
                                             dict(precision_overrides or {}), allow_overflow, calib,
                                             RunnerOptions(cc=cc, cache_dir=cache_dir, num_threads=num_threads))
        for o in report.overflows:
            _log.warning("precision=%s: %s (allowed by allow_overflow=True)", precision, o.describe())
            notes.append(f"allow_overflow: {o.describe()}")
    if int8 is not None:
        report = int8
    _log_plan(graph, target, signature)

    def info(cached: bool | None) -> CompileInfo:
        return CompileInfo(graph.name, kind, digest, time.perf_counter() - t0, cached, at, tuple(notes),
                           None if report is None else report.to_json())

    def done(m: CompiledModel) -> CompiledModel:
        cache = {None: "no build", True: "build cache hit", False: "built"}[m.info.cached]
        ops = [n.op for n in graph.walk()]
        _log.info("compiled %r for %s: %d nodes (+%d constants), %d inputs, %d outputs, %d run-time shape checks, "
                  "%.3f s (%s)", graph.name, target, len(ops) - ops.count("constant"), ops.count("constant"),
                  len(graph.inputs), len(graph.outputs), len(signature.checks), m.info.seconds or 0.0, cache)
        return m

    if target == "ref":
        from cuvil.backends.ref import RefExecutor

        with stage(_log, "load", times):
            executor: Any = RefExecutor(graph)
        return done(CompiledModel(signature, executor, target, graph, info(None)))
    from pathlib import Path

    if target == "wasm32":
        from cuvil.backends.wasm import WasmBuildOptions, WasmExecutor
        from cuvil.backends.wasm import build as build_wasm

        if cc or sanitize:
            raise CuvilError("cc= and sanitize= apply to the native C targets; wasm32 builds with zig cc")
        with stage(_log, "wasm build", times):
            wb = build_wasm(graph, WasmBuildOptions(cache_dir=Path(cache_dir) if cache_dir else None,
                                                       conv_algorithm=conv_choice))
        with stage(_log, "load", times):
            executor = WasmExecutor(wb)
        return done(CompiledModel(signature, executor, target, graph, info(wb.cached)))
    from cuvil.backends.c import BuildOptions, CExecutor, build
    from cuvil.backends.c.toolchain import Compiler

    b = build(graph, BuildOptions(target=target, compiler=Compiler.from_string(cc),
                                  cache_dir=Path(cache_dir) if cache_dir else None, sanitize=sanitize,
                                  conv_algorithm=conv_choice))
    unloadable = _cannot_run_here(target)
    if unloadable:
        _log.warning("%s: built, not loaded: %s; save it (CompiledModel.save, cuvil compile -o) and run it on a "
                     "CPU that has them", target, unloadable)
    with stage(_log, "load", times):
        executor = CExecutor(b, num_threads=num_threads, unloadable=unloadable)
    return done(CompiledModel(signature, executor, target, graph, info(b.cached)))


def _cannot_run_here(target: str) -> str | None:
    """Why code built for C target ``target`` cannot run on this machine's CPU (None when it can, or
    when the CPU's features cannot be read: then loading the library checks)."""
    from cuvil.backends.c.toolchain import cpu_cannot_run

    return cpu_cannot_run(target)


def _quantize(graph: Graph, model: Any, target: str, passes: Any, enable_fusion: bool, precision: str, dataset: Any,
              report_samples: int, times: dict[str, float], quant_dtype: str, symmetric: bool, per_channel: bool,
              calibration: str, min_samples: int | None, cc: str | None = None, cache_dir: str | None = None,
              num_threads: int | None = None, reduce_range: bool | None = None) -> tuple[Graph, Any]:
    """Post-training quantization with its own pipeline around calibration (cuvil/quant/ptq.py); its
    calibration build uses the compile's ``cc``, ``cache_dir`` and ``num_threads``."""
    from cuvil.backends.c.toolchain import int8_products
    from cuvil.quant.calibrate import RunnerOptions
    from cuvil.quant.ptq import QuantizationError, QuantOptions, compile_int8

    if reduce_range is None:
        reduce_range = int8_products(target) == "bytes"
        if reduce_range:
            _log.info("int8 weights in [-64, 64] (reduce_range): on %s the int8 kernels multiply 7-bit weights "
                      "with vpmaddubsw, exactly and faster than 8-bit ones; reduce_range=False keeps "
                      "[-127, 127]", target)
    options = QuantOptions(quant_dtype, symmetric, per_channel, calibration, min_samples=min_samples,
                           reduce_range=reduce_range)
    if passes is not None:
        raise QuantizationError("quant_dtype= runs its own pipeline (the passes up to fold-batchnorm, calibration, "
                                "then fold-qdq and fusion); it cannot be combined with passes=")
    if precision != "fp32":
        raise QuantizationError(f"quant_dtype={quant_dtype!r} and precision={precision!r} cannot be combined: "
                                "int8 layers compute in float32 where they are not quantized")
    return compile_int8(graph, graph is model, target, enable_fusion, dataset, options, report_samples, times,
                        RunnerOptions(cc=cc, cache_dir=cache_dir, num_threads=num_threads))


def _precision_pass(precision: str, overrides: Mapping[str, str] | None) -> Pass | None:
    """The ``convert-precision`` pass ``precision`` asks for (None for fp32)."""
    from cuvil.passes.convert_precision import ALIASES, ConvertPrecision, format_overrides, parse_overrides

    p = ALIASES.get(precision.lower()) if isinstance(precision, str) else None
    if p not in ("f32", "f16", "bf16"):
        raise CuvilError(f"unknown precision {precision!r}; choose fp32, fp16 or bf16")
    if p == "f32":
        if overrides:
            raise CuvilError("precision_overrides apply to precision='fp16' or 'bf16'")
        return None
    return ConvertPrecision(dtype=p, overrides=format_overrides(parse_overrides(overrides or {})))


def _with_precision(passes: list[Pass], convert: Pass) -> list[Pass]:
    """``passes`` with ``convert`` right after the clean-up passes and batch-norm folding: before any
    pass that fuses, changes layout or plans memory (fused regions and NHWC kernels are float32-only
    rewrites, and a memory plan must describe the final graph)."""
    from cuvil.passes import (
        Canonicalize,
        CommonSubexpressionElimination,
        DeadCodeElimination,
        FoldBatchNorm,
        FoldConstants,
    )

    basic = (Canonicalize, FoldConstants, CommonSubexpressionElimination, DeadCodeElimination, FoldBatchNorm)
    at = next((i for i, p in enumerate(passes) if not isinstance(p, basic)), len(passes))
    return [*passes[:at], convert, *passes[at:]]


def _run_passes(graph: Graph, model: Any, target: str, passes: str | Sequence[Pass] | PassManager | None,
                enable_fusion: bool, times: dict[str, float], convert: Pass | None = None) -> Graph:
    """The graph after the pass pipeline (verified again: the backends take only valid IR)."""
    from cuvil.passes import PassManager, default_pipeline
    from cuvil.passes.convert_precision import ConvertPrecision
    from cuvil.passes.rewrite import copy_graph

    if passes is None:
        passes = default_pipeline(target, enable_fusion=enable_fusion)
    if convert is not None:
        if isinstance(passes, PassManager):
            if not any(isinstance(p, ConvertPrecision) for p in passes.passes):
                raise CuvilError(f"precision= with a PassManager: put {convert} in its pipeline "
                                 "(before the fusion passes)")
        else:
            passes = _with_precision(PassManager(passes).passes, convert)
    manager = passes if isinstance(passes, PassManager) else PassManager(passes)
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


def _log_plan(graph: Graph, target: str, signature: Signature) -> None:
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
    where = "the reference interpreter" if target == "ref" else f"the {target} code generator"
    _log.debug("partitions: 1 (the whole graph: %d nodes besides constants, on %s)", len(nodes), where)
    fused = sum(1 for n in nodes if n.op in FUSED_OPS)
    _log.debug("fusion groups: %d (%d fused nodes; every other node is a group of its own)", len(nodes), fused)
    for i, n in enumerate(nodes):
        what = f"{n.op}: {', '.join(group_ops(n))}" if n.op in FUSED_OPS else n.op
        _log.debug("fusion group %d: node %r (%s)", i, n.name, what)
    for chk in signature.checks:
        _log.debug("shape check at run time: %s needs %s (%s)", chk.where(), chk.describe(), chk.what)
    if target == "ref":
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

"""TorchScript models: scripted and traced modules and functions, and the files ``torch.jit.save`` writes.

A file is checked to be a TorchScript archive (:mod:`cuvil.frontends.torch_file`) and
read with ``torch.jit.load``.  The model is then converted by the first of two routes
that succeeds; which one, and why the first failed, is logged at INFO:

1. torch's TorchScript-to-ExportedProgram converter
   (``torch._export.converter.TS2EPConverter``) turns the TorchScript graph into an
   exported program on the example inputs; its graph module is exported again with the
   user's ``input_spec`` and ``dynamic_shapes`` (so symbolic dims, their names and
   ranges mean what they mean for an ``nn.Module``) and converted like any exported
   program.  Control flow that only the inputs' ranks decide (``if x.dim() == 3``) is
   specialised to the branch the examples take, which is the branch every input of the
   same ranks takes; a condition on a dynamic dim is decided under torch.export's
   assumptions about dynamic dims, as for an ``nn.Module``.  A model that fixes a dim the
   input spec calls dynamic is refused with torch.export's explanation: the ONNX exporter
   would not notice, and the result would be wrong for other sizes.
2. torch's TorchScript ONNX exporter (``torch.onnx.export(..., dynamo=False)``, opset
   17) writes an ONNX model that Cuvil's ONNX front end imports: scripted loops become
   ``Loop`` nodes, conditions ``If`` nodes (folded at import where the types decide
   them).  Symbolic dims become named dynamic axes, so only plain symbol names
   (``"batch"``), not expressions (``"2*n"``), can be dynamic on this route.

Inputs are positional (a TorchScript ``forward`` has no keyword-only inputs); the
outputs are named as for an ``nn.Module`` (``output``, or ``output_0``, ``output_1`` ...).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from cuvil.errors import CuvilError, ModelError, UnsupportedOpError
from cuvil.frontends.torch import TorchImport, convert_exported, output_names, refine_symbols
from cuvil.frontends.torch.export import axes_of, check_eval_mode, example_inputs, explain, export_model
from cuvil.frontends.torch_file import check_torchscript_archive
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo

log = logging.getLogger("cuvil.frontends.torch")

ONNX_OPSET = 17


def load_torchscript(model: Any, input_spec: Any = None, dynamic_shapes: Any = None,
                     dims: Mapping[str, SymbolInfo] | None = None) -> TorchImport:
    """Convert a TorchScript module or function, or the ``torch.jit.save`` file at path ``model``."""
    kind, digest = "torchscript module", None
    if isinstance(model, str | os.PathLike):
        kind, digest = "torchscript file", _file_digest(model)
        model = load_file(model)
    name = _model_name(model)
    if getattr(model, "training", False):
        check_eval_mode(model)
    if input_spec is None:
        raise CuvilError("compiling a TorchScript model needs input_spec: example tensors or cuvil.TensorSpec "
                         "objects, one per input of its forward, in order")
    if isinstance(input_spec, Mapping):
        raise CuvilError("a TorchScript model takes its inputs by position: give input_spec as a list")
    args, _, spec_shapes = example_inputs(input_spec, dims or {})  # a bad spec is refused here, before either route
    if spec_shapes is not None and dynamic_shapes is not None:
        raise CuvilError("give symbolic dims either in cuvil.TensorSpec shapes or in dynamic_shapes, not both")
    t0 = time.perf_counter()
    try:
        imported = _via_export(model, args, input_spec, dynamic_shapes, dims, name)
        imported.seconds["torchscript"] = time.perf_counter() - t0
        log.info("TorchScript model %r: converted by torch's TorchScript-to-ExportedProgram converter, then "
                 "torch.export", name)
    except Exception as exc:
        if isinstance(exc, CuvilError) and not isinstance(exc, ModelError | UnsupportedOpError):
            raise  # the user's error (a bad dims= entry ...): the other route would refuse it too
        if _violates_dims(exc):
            # the model fixes a dim the spec calls dynamic; the ONNX exporter would not notice, and the
            # compiled model would be wrong (or fail) for other sizes
            raise
        first = _summary(exc)
        log.info("TorchScript model %r: the TorchScript-to-ExportedProgram route failed (%s); converting through "
                 "torch's TorchScript ONNX exporter (opset %d)", name, first, ONNX_OPSET)
        try:
            imported = _via_onnx(model, args, spec_shapes if spec_shapes is not None else dynamic_shapes, dims, name)
        except Exception as exc2:
            if isinstance(exc2, CuvilError) and not isinstance(exc2, ModelError | UnsupportedOpError):
                raise
            if isinstance(exc, UnsupportedOpError) and isinstance(exc2, UnsupportedOpError):
                raise UnsupportedOpError(exc.uses + exc2.uses) from exc2  # the ATen ops, then the ONNX ones
            raise ModelError(f"TorchScript model {name!r} could not be converted: through torch.export: {first}; "
                             f"through torch's ONNX exporter: {_summary(exc2)}") from exc2
        imported.seconds["torchscript"] = time.perf_counter() - t0
        log.info("TorchScript model %r: converted through torch's TorchScript ONNX exporter", name)
    imported.kind = kind
    if digest is not None:
        imported.sha256 = digest
    return imported


def _violates_dims(exc: BaseException) -> bool:
    """Whether torch.export refused the user's dynamic dims (the model specialises them)."""
    cause = exc.__cause__
    return isinstance(exc, ModelError) and cause is not None and (
        type(cause).__name__ == "ConstraintViolationError" or "Constraints violated" in str(cause))


def load_file(path: str | os.PathLike[str]) -> Any:
    """The TorchScript module a ``torch.jit.save`` file holds (on the CPU)."""
    import torch

    check_torchscript_archive(path)
    load: Any = torch.jit.load  # untyped in torch
    try:
        return load(os.fspath(path), map_location="cpu")
    except Exception as exc:
        raise ModelError(f"{os.fspath(path)}: torch.jit.load could not read it: {_summary(exc)}") from exc


def _model_name(model: Any) -> str:
    name = getattr(model, "original_name", None) or getattr(model, "name", None)
    return str(name) if name else type(model).__name__


def _summary(exc: BaseException) -> str:
    """The first line of an error's explanation, short enough for one log line."""
    text = str(exc) if isinstance(exc, CuvilError) else explain(exc)
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return line if len(line) <= 300 else line[:297] + "..."


def _file_digest(path: str | os.PathLike[str]) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None  # load_file reports the missing file
    return h.hexdigest()


# route 1: TorchScript -> ExportedProgram -> torch.export with the user's input spec ----------------------


def _via_export(model: Any, args: Sequence[Any], input_spec: Any, dynamic_shapes: Any,
                dims: Mapping[str, SymbolInfo] | None, name: str) -> TorchImport:
    from torch._export.converter import TS2EPConverter

    # The converter traces with Dim.AUTO on every dim and warns, through torch's logger, of each dim
    # the examples hold at 1; the export below uses the user's dims, so those notes are not theirs.
    auto_notes = logging.getLogger("torch._export.non_strict_utils")
    level = auto_notes.level
    auto_notes.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the converter's notes on unused state-dict entries
            program = TS2EPConverter(model, tuple(args)).convert()
    finally:
        auto_notes.setLevel(level)
    # torch marks the program's module as training: its dropout and batch-norm nodes are fixed already
    exported = export_model(program.module(), input_spec, dynamic_shapes, dims, check_mode=False)
    imported = convert_exported(exported, name, dims)
    _rename_inputs(imported.graph, _input_names(model, len(args)))
    return imported


def _rename_inputs(graph: Graph, names: Sequence[str]) -> None:
    """The graph's inputs named after the forward's arguments (the converter suffixes them: ``x_1``),
    where no other value of the graph has that name."""
    inputs = set(graph.inputs)
    taken = {v.name for n in graph.walk() for v in n.outputs} | {v.name for v in graph.outputs if v not in inputs}
    for v, want in zip(graph.inputs, names):
        if want != v.name and want not in taken and want not in {u.name for u in graph.inputs}:
            v.name = want


# route 2: torch's TorchScript ONNX exporter -------------------------------------------------------------


def _via_onnx(model: Any, args: Sequence[Any], shapes: Any, dims: Mapping[str, SymbolInfo] | None,
              name: str) -> TorchImport:
    import torch
    import torch.utils._pytree as pytree

    from cuvil.frontends.onnx import load_onnx

    inputs = _input_names(model, len(args))
    with torch.no_grad():
        result = model(*args)
    paths = [p for p, _ in pytree.tree_flatten_with_path(result)[0]]
    outputs = output_names(paths)
    axes = _dynamic_axes(inputs, shapes)
    f: Any = io.BytesIO()  # the exporter writes to a file object too, though its annotation names paths
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and tracer notes
        torch.onnx.export(model, tuple(args), f, dynamo=False, opset_version=ONNX_OPSET, input_names=inputs,
                          output_names=outputs, dynamic_axes=axes or None)
    seconds = {"onnx export": time.perf_counter() - t0}
    data = f.getvalue()
    t0 = time.perf_counter()
    graph: Graph = load_onnx(data, symbols=dims)
    graph.name = name
    if dims:
        refine_symbols(graph, dims)
    seconds["convert"] = time.perf_counter() - t0
    return TorchImport(graph, hashlib.sha256(data).hexdigest(), seconds)


def _input_names(model: Any, n: int) -> list[str]:
    """The forward's argument names (``self`` left out), else ``input_0`` ..."""
    fn = getattr(model, "forward", model)
    try:
        names = [a.name for a in fn.schema.arguments if a.name != "self"]
    except (AttributeError, RuntimeError):
        names = []
    if len(names) != n:
        raise ModelError(f"the TorchScript model's forward takes {len(names)} inputs, but input_spec gives {n}")
    return names


def _dynamic_axes(inputs: Sequence[str], shapes: Any) -> dict[str, dict[int, str]]:
    """torch.onnx's dynamic_axes for the symbolic dims of each input: plain torch Dims by their names,
    dims torch picks (``Dim.AUTO``, ``Dim.DYNAMIC``) as ``<input>_dim<axis>``."""
    if shapes is None:
        return {}
    per_input = list(shapes.values()) if isinstance(shapes, Mapping) else list(shapes)
    out: dict[str, dict[int, str]] = {}
    for name, spec in zip(inputs, per_input):
        for axis, d in axes_of(spec).items():
            if hasattr(d, "root"):
                raise ModelError(f"input {name!r} dim {axis} is derived from another dim ({d.__name__}), which "
                                 "ONNX dynamic axes cannot express: give it a name of its own or a fixed size")
            label = getattr(d, "__name__", None)
            out.setdefault(name, {})[axis] = label if isinstance(label, str) and label.isidentifier() \
                else f"{name}_dim{axis}"
    return out

"""The PyTorch front end: an ``nn.Module`` (or an ``ExportedProgram``) to Cuvil IR through torch.export;
TorchScript models (modules, functions, ``torch.jit.save`` files) through :mod:`.torchscript`.

:func:`load_torch` exports the model (:mod:`.export`), names its symbolic
dims after the user's ``torch.export.Dim`` objects with their ranges
(:mod:`.symbols`), turns parameters, buffers and lifted constants into
constants (copied: the compiled model keeps no reference to the module or its
tensors) and maps every node (:mod:`.converter` and the ``aten_*`` modules).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import math
import os
import pkgutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, ModelError
from cuvil.frontends.torch.converter import Converter, OpMapping, aten, supported_targets
from cuvil.frontends.torch.export import Exported, check_eval_mode, export_model, is_torch_model, is_torchscript
from cuvil.frontends.torch.symbols import SymbolTable
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo

# The ATen mappings register themselves when imported: modules aten_*.py here, and every module of aten/.
for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("aten_"):
        importlib.import_module(f"{__name__}.{_m.name}")
for _m in sorted(pkgutil.iter_modules([str(Path(__file__).parent / "aten")]), key=lambda m: m.name):
    importlib.import_module(f"{__name__}.aten.{_m.name}")

log = logging.getLogger("cuvil.frontends.torch")


@dataclass
class TorchImport:
    """A converted PyTorch model: its graph, a digest of what was compiled, and stage timings.

    ``program`` is the decomposed ExportedProgram the graph was converted from,
    ``value_sources`` maps the name of each value that is an FX node's result to that node's
    name, so a value of the graph (when it survives the passes) can be traced to its source, and
    ``mappings`` is the converter's op-mapping table: one record per converted FX node.  ``kind``
    says what was compiled (``cuvil.CompileInfo.source_kind``).  A TorchScript model converted
    through torch's ONNX exporter has no program, sources or mappings."""

    graph: Graph
    sha256: str
    seconds: dict[str, float] = field(default_factory=dict)
    program: Any = None
    value_sources: dict[str, str] = field(default_factory=dict)
    mappings: tuple[OpMapping, ...] = ()
    kind: str = "pytorch module"


def load_torch(model: Any, input_spec: Any = None, dynamic_shapes: Any = None,
               dims: Mapping[str, SymbolInfo] | None = None) -> TorchImport:
    """Export ``model`` and convert it; ``dims`` constrains symbols further (never beyond what torch allows).

    A TorchScript model (a scripted or traced module or function, or the path of a file
    ``torch.jit.save`` wrote) goes through :mod:`.torchscript`."""
    import cuvil.ops  # noqa: F401  (registers the op set)

    if isinstance(model, str | os.PathLike) or is_torchscript(model):
        from cuvil.frontends.torch.torchscript import load_torchscript

        return load_torchscript(model, input_spec, dynamic_shapes, dims)
    exported = export_model(model, input_spec, dynamic_shapes, dims)
    return convert_exported(exported, type(model).__name__, dims)


def convert_exported(exported: Exported, name: str, dims: Mapping[str, SymbolInfo] | None = None) -> TorchImport:
    """The Cuvil graph of an exported, decomposed program, named ``name``."""
    t0 = time.perf_counter()
    symbols = _symbols(exported)
    constants = _constants(exported.program)
    user_inputs, output_names = _signature(exported.program)
    converter = Converter(exported.program, symbols)
    graph = converter.convert(constants, user_inputs, output_names)
    graph.name = name
    if dims:
        refine_symbols(graph, dims)
    seconds = dict(exported.seconds, convert=time.perf_counter() - t0)
    log.debug("converted %d ATen nodes to %d Cuvil nodes in %.3f s", len(exported.program.graph.nodes),
              len(graph.nodes), seconds["convert"])
    return TorchImport(graph, _digest(exported.program, constants), seconds, exported.program, converter.value_sources,
                       tuple(converter.mappings))


def _symbols(exported: Exported) -> SymbolTable:
    """Torch symbols named after the user's Dims (or ``input_dimN`` for dims torch made dynamic by itself)."""
    table = SymbolTable()
    direct: set[str] = set()
    placeholders = {n.name: n for n in exported.program.graph.nodes if n.op == "placeholder"}
    from torch.export.graph_signature import InputKind, TensorArgument

    specs = [s for s in exported.program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    for spec, axes in zip(specs, exported.input_dims):
        if not isinstance(spec.arg, TensorArgument):
            continue
        val = placeholders[spec.arg.name].meta["val"]
        for axis, size in enumerate(val.shape):
            if isinstance(size, int):
                continue
            expr = size.node.expr
            user_dim = axes.get(axis)
            if expr.is_Symbol:
                direct.add(str(expr))
                name = getattr(user_dim, "__name__", None) if not hasattr(user_dim, "root") else None
                table.bind(str(expr), name if isinstance(name, str) and name.isidentifier()
                           else f"{spec.arg.name}_dim{axis}")
            elif user_dim is not None and hasattr(user_dim, "root") and len(expr.free_symbols) == 1:
                (root,) = expr.free_symbols
                table.bind(str(root), str(user_dim.root.__name__))
    table.constrain(exported.program.range_constraints, direct)
    for name, info in table.infos.items():
        log.debug("symbol %s: %s", name, info.describe() or "unconstrained")
    return table


def _constants(program: Any) -> dict[str, np.ndarray]:
    """Parameters, buffers and lifted constants by placeholder name, copied out of the module's tensors."""
    import torch
    from torch.export.graph_signature import InputKind

    out: dict[str, np.ndarray] = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise ModelError(f"exported input {spec.arg.name!r} is a {spec.kind.name.lower()}, which Cuvil cannot compile")
        t = program.state_dict.get(spec.target)
        if t is None:
            t = program.constants.get(spec.target)
        if not isinstance(t, torch.Tensor):
            raise ModelError(f"exported input {spec.arg.name!r} ({spec.target}) has no tensor value")
        out[spec.arg.name] = _to_numpy(t)
    return out


def _to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach().cpu()
    if t.dtype is torch.bfloat16:
        import ml_dtypes

        bits: np.ndarray = t.view(torch.int16).numpy()
        return np.array(bits.view(ml_dtypes.bfloat16), copy=True)
    out: np.ndarray = np.array(t.numpy(), copy=True, order="C")
    return out


def _signature(program: Any) -> tuple[list[str], list[str]]:
    """User input placeholder names, and a name for each output after its place in the model's result
    (``output`` for a lone tensor, ``output_0`` ... for a tuple, the key for a dict)."""
    import torch.utils._pytree as pytree
    from torch.export.graph_signature import InputKind, OutputKind

    outs = program.graph_signature.output_specs
    bad = [s for s in outs if s.kind != OutputKind.USER_OUTPUT]
    if bad:
        what = ", ".join(f"{s.kind.name.lower()} of {s.target!r}" for s in bad)
        raise ModelError(f"the model changes its state when it runs ({what}); Cuvil compiles models whose "
                         "forward only computes outputs")
    n = len(outs)
    tree = pytree.tree_unflatten(list(range(n)), program.call_spec.out_spec)
    paths: list[Any] = [()] * n
    try:
        flat = pytree.tree_flatten_with_path(tree)[0]
    except ValueError:  # a type registered without key paths (transformers' ModelOutput): walk it as a mapping
        flat = list(_key_paths(tree, ()))
    for path, leaf in flat:
        paths[leaf] = path
    inputs = [s.arg.name for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return inputs, output_names(paths)


def _key_paths(tree: Any, prefix: tuple[Any, ...]) -> Any:
    """``(path, leaf)`` of each leaf of a tree of mappings and sequences (other nodes by pytree's order)."""
    import torch.utils._pytree as pytree

    if isinstance(tree, Mapping):
        items: Any = ((pytree.MappingKey(k), v) for k, v in tree.items())
    elif isinstance(tree, list | tuple):
        items = ((pytree.SequenceKey(i), v) for i, v in enumerate(tree))
    elif isinstance(tree, int):
        yield prefix, tree
        return
    else:
        items = ((pytree.SequenceKey(i), v) for i, v in enumerate(pytree.tree_leaves(tree)))
    for key, sub in items:
        yield from _key_paths(sub, (*prefix, key))


def output_names(paths: Sequence[Any]) -> list[str]:
    """A name for each output from its pytree path in the model's result: ``output`` for a lone tensor,
    ``output_0`` ... for a tuple, the key for a dict."""
    names = [_path_name(p) for p in paths]
    if len(names) == 1 and names[0] in ("", "0"):
        return ["output"]
    return [f"output_{x}" if x.replace("_", "").isdigit() or not x else x for x in names]


def _path_name(path: Any) -> str:
    parts = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
    return "_".join(parts)


def _digest(program: Any, constants: Mapping[str, np.ndarray]) -> str:
    """sha256 of the exported graph's code and every constant's name, type and bytes."""
    h = hashlib.sha256(program.graph_module.code.encode())
    for name in sorted(constants):
        a = constants[name]
        h.update(f"{name}:{a.dtype}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def refine_symbols(graph: Graph, dims: Mapping[str, SymbolInfo]) -> None:
    """Narrow the exported symbols by ``dims``; widening what torch.export allowed is refused,
    since the graph was traced under torch's ranges."""
    for name, want in dims.items():
        have = graph.symbols.get(name)
        if have is None:
            known = ", ".join(sorted(graph.symbols)) or "none"
            raise CuvilError(f"dims: the model has no symbolic dim {name!r} (its symbols: {known})")
        lo, hi = have.min, have.max
        if want.min is not None:
            if lo is not None and want.min < lo:
                raise CuvilError(f"dims: {name} minimum {want.min} is below the {lo} torch.export allowed")
            lo = want.min
        if want.max is not None:
            if hi is not None and want.max > hi:
                raise CuvilError(f"dims: {name} maximum {want.max} is above the {hi} torch.export allowed")
            hi = want.max
        mult = have.multiple_of
        if want.multiple_of is not None:
            mult = want.multiple_of if mult is None else math.lcm(mult, want.multiple_of)
        graph.symbols[name] = SymbolInfo(name, lo, hi, mult)
    graph.share_symbols()


__all__ = ["OpMapping", "TorchImport", "aten", "check_eval_mode", "convert_exported", "is_torch_model", "is_torchscript",
           "load_torch", "output_names", "refine_symbols", "supported_targets"]

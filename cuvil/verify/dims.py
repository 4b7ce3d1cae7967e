"""The extents the suite draws each symbolic dim at: the graph's dim analysis over what the user declared.

:func:`dim_analysis` gives :func:`cuvil.ir.dim_domains.analyse_dims` the constraints and typical
extents that do not come from the graph: ``[inputs.NAME] dims`` of the configuration (per axis,
or by symbol name; see cuvil.verify.config) and the extents of the source's example tensors (a
PyTorch module's ``input_spec``, exported with those dims dynamic). A declared typical extent
wins over an example's. Declared bounds (``min``, ``max``, ``multiple_of``) are also the contract
the checks' builds are compiled to (:func:`constrain`, as ``cuvil compile --dim`` does), so a
build refuses what the declaration excludes, and ``dynamic-shapes`` checks that it does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cuvil.ir.dim_domains import DimAnalysis, analyse_dims, merge_info
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import DimExpr, free_symbols
from cuvil.ir.types import SymbolInfo
from cuvil.verify.base import VerifyError
from cuvil.verify.config import DeclaredDim


def _symbol_of(d: Any) -> str | None:
    """The symbol a dim is, when it is exactly one symbol (``width``, not ``width + 1``)."""
    if isinstance(d, DimExpr):
        names = free_symbols(d)
        if len(names) == 1:
            name = next(iter(names))
            if d == DimExpr.symbol(name):
                return name
    return None


def declared_by_symbol(graph: Graph, dims: Mapping[str, Any]) -> dict[str, DeclaredDim]:
    """``[inputs.NAME] dims`` as one declaration per symbol; a usage error when an entry does not fit the input."""
    by_name = {v.name: v for v in graph.inputs}
    symbols = {s for v in graph.inputs for d in v.type.shape for s in free_symbols(d)}
    out: dict[str, DeclaredDim] = {}
    for name, decl in dims.items():
        v = by_name.get(name)
        if v is None:
            raise VerifyError(f"[inputs.{name}] dims: the model has no input {name!r} (its inputs: "
                              f"{', '.join(by_name)})")
        where = f"[inputs.{name}] dims"
        if isinstance(decl, Mapping):
            for s, d in decl.items():
                if s not in symbols:
                    raise VerifyError(f"{where}: {s!r} is not a symbolic dim of the model's inputs (its symbols: "
                                      f"{', '.join(sorted(symbols)) or 'none'})")
                out[s] = d
            continue
        if len(decl) != v.type.rank:
            raise VerifyError(f"{where} lists {len(decl)} dims; {name} has {v.type.rank} ({v.type})")
        for axis, (d, want) in enumerate(zip(decl, v.type.shape)):
            if isinstance(want, int):
                if d != DeclaredDim(typical=want) and d != DeclaredDim():
                    raise VerifyError(f"{where}: axis {axis} of {name} is fixed at {want}; the entry must be {want}")
                continue
            s = _symbol_of(want)
            if s is None:
                raise VerifyError(f"{where}: axis {axis} of {name} is {want}, not one symbol; declare its symbols "
                                  "by name (dims = {{ NAME = ... }})")
            out[s] = d
    return out


def example_extents(graph: Graph, spec: Any) -> dict[str, int]:
    """Per symbol, its extent in the source's example tensors (torch tensors or arrays given as ``input_spec``)."""
    names = [v.name for v in graph.inputs]
    if isinstance(spec, Mapping):
        examples: Sequence[Any] = [spec.get(n) for n in names]
    elif isinstance(spec, (list, tuple)):
        examples = list(spec)[: len(names)]
    else:
        return {}
    out: dict[str, int] = {}
    for v, ex in zip(graph.inputs, examples):
        shape = getattr(ex, "shape", None)
        if shape is None or not (hasattr(ex, "detach") or hasattr(ex, "__array__")):
            continue
        try:
            extents = [int(n) for n in shape]
        except (TypeError, ValueError):
            continue
        if len(extents) != v.type.rank:
            continue
        for d, n in zip(v.type.shape, extents):
            s = _symbol_of(d)
            if s is not None:
                out.setdefault(s, n)
    return out


def dim_analysis(graph: Graph, dims: Mapping[str, Any], example_spec: Any) -> DimAnalysis:
    """The dim analysis the suite draws shapes from: the graph's requirements, the declared
    ``dims`` and the example's extents as typical values."""
    declared = declared_by_symbol(graph, dims)
    typical: dict[str, tuple[int, str]] = {s: (n, "the example's extent")
                                           for s, n in example_extents(graph, example_spec).items()}
    for s, d in declared.items():
        if d.typical is not None:
            typical[s] = (d.typical, "declared in the configuration")
    infos = {s: SymbolInfo(s, d.min, d.max, d.multiple_of) for s, d in declared.items()}
    return analyse_dims(graph, infos, typical)


def constrain(graph: Graph, dims: Mapping[str, Any]) -> None:
    """Merge the bounds ``[inputs.NAME] dims`` declares into ``graph``'s symbols (each keeps its own too)."""
    for s, d in declared_by_symbol(graph, dims).items():
        if d.min is not None or d.max is not None or d.multiple_of is not None:
            graph.symbols[s] = merge_info(s, graph.symbols.get(s), SymbolInfo(s, d.min, d.max, d.multiple_of))

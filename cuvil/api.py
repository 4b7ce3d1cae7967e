"""The public entry point: ``cuvil.compile``."""

from __future__ import annotations

import datetime
import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo
from cuvil.ir.verify import verify
from cuvil.runtime.compiled import CompiledModel, CompileInfo, Signature

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
) -> CompiledModel:
    """Compile a model (ONNX path or ModelProto, or a Cuvil Graph) for ``target``."""
    if target not in TARGETS:
        raise CuvilError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    t0 = time.perf_counter()
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    graph = import_model(model, dims)
    verify(graph)
    kind, digest = source_digest(model, graph)

    def info(cached: bool | None) -> CompileInfo:
        return CompileInfo(graph.name, kind, digest, time.perf_counter() - t0, cached, at)

    if target == "ref":
        from cuvil.backends.ref import RefExecutor

        return CompiledModel(Signature.of(graph), RefExecutor(graph), target, graph, info(None))
    from pathlib import Path

    if target == "wasm32":
        from cuvil.backends.wasm import WasmBuildOptions, WasmExecutor
        from cuvil.backends.wasm import build as build_wasm

        if cc or sanitize:
            raise CuvilError("cc= and sanitize= apply to the native C targets; wasm32 builds with zig cc")
        wb = build_wasm(graph, WasmBuildOptions(cache_dir=Path(cache_dir) if cache_dir else None))
        return CompiledModel(Signature.of(graph), WasmExecutor(wb), target, graph, info(wb.cached))
    from cuvil.backends.c import BuildOptions, CExecutor, build
    from cuvil.backends.c.toolchain import Compiler

    b = build(graph, BuildOptions(target=target, compiler=Compiler.from_string(cc),
                                  cache_dir=Path(cache_dir) if cache_dir else None, sanitize=sanitize))
    executor = CExecutor(b)
    return CompiledModel(Signature.of(graph), executor, target, graph, info(b.cached))


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

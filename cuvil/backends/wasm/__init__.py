"""The WebAssembly backend (target "wasm32"): the C backend's code compiled to wasm32 + SIMD128.

The generated C is the C backend's, unchanged (cuvil/backends/c/codegen.py);
``zig cc`` from the ``ziglang`` package compiles it to ``model.wasm``, stored
with ``weights.bin`` in the build cache, and wasmtime runs it
(cuvil/backends/wasm/runtime.py). The module exports the C API of
``cuvil_api.h``, so any wasm host can run it without Python: docs/wasm.md.

A saved artifact (cuvil/runtime/artifact.py) holds ``model.wasm``,
``weights.bin``, ``model.c`` and the runtime headers it includes, and the
zig command that rebuilds the module from them.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil._version import __version__
from cuvil.backends.c import _runtime_digest, cache, runtime_headers
from cuvil.backends.c.codegen import CodegenOptions, GeneratedModule, generate
from cuvil.backends.wasm.runtime import WasmModel
from cuvil.backends.wasm.toolchain import Zig, build_wasm, compile_flags, zig_global_cache
from cuvil.errors import CuvilError, ModelError
from cuvil.ir.graph import Graph
from cuvil.runtime.compiled import BuildInfo

WASM_TARGET = "wasm32"


@dataclass(frozen=True)
class WasmBuildOptions:
    zig: Zig = field(default_factory=Zig)
    cache_dir: Path | None = None  # the Cuvil build cache (default: ~/.cache/cuvil); see zig_global_cache
    conv_algorithm: str | tuple[tuple[str, str], ...] = "auto"  # see backends/c/kernels/conv_algorithm.py
    faults: frozenset[str] = frozenset()  # the compile's planted faults (cuvil/faults.py)
    options_key: str = ""  # CompileOptions.build_key: part of the build-cache key


@dataclass
class WasmBuild(cache.BuildFolder):
    """A built WebAssembly module: its folder (source, module, weights) and how long the build took."""

    module: GeneratedModule | None = None
    options: WasmBuildOptions | None = None

    @property
    def wasm(self) -> Path:
        return self.folder / "model.wasm"


def build(graph: Graph, options: WasmBuildOptions) -> WasmBuild:
    """Generate, compile to WebAssembly (or fetch from the cache) and return the model's build folder."""
    t0 = time.perf_counter()
    module = generate(graph, CodegenOptions(target=WASM_TARGET, model_name=graph.name,
                                            conv_algorithm=options.conv_algorithm, faults=options.faults))
    key_parts = (__version__, WASM_TARGET, options.zig.version, " ".join(compile_flags()), _runtime_digest(),
                 *((options.options_key,) if options.options_key else ()))
    root = options.cache_dir or cache.default_cache_dir()

    def compile_source(src: Path, folder: Path) -> str:
        return build_wasm(options.zig, src, folder / "model.wasm", zig_cache=zig_global_cache(root))

    folder, hit = cache.build_model_folder(root, module.source, module.weights, key_parts, compile_source)
    return WasmBuild(folder, hit, time.perf_counter() - t0, module, options)


class WasmExecutor:
    """Runs a built model's WebAssembly module (one instance per calling thread)."""

    def __init__(self, b: WasmBuild, facts: Mapping[str, Any] | None = None) -> None:
        self.build = b
        self.model = WasmModel(b.wasm, b.weights)
        if facts is None:
            if b.options is None:
                raise CuvilError("a wasm32 build needs its build options or saved facts")
            facts = build_facts(b.options.zig)
        self.facts = dict(facts)

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return self.model.run(inputs)

    def build_info(self, target: str) -> BuildInfo:
        """What ``CompiledModel.build_info`` reports for this build (one thread per call)."""
        b = self.build
        return BuildInfo(target, b.folder, b.source, b.wasm, b.weights, b.weights.stat().st_size, b.cached,
                         None if b.module is None else tuple(b.module.line_origins), 1)

    # what an artifact (cuvil/runtime/artifact.py) needs --------------------------
    def artifact_files(self) -> dict[str, Path]:
        """Every file a saved artifact holds, by its name there: source, headers, module, weights."""
        files = {"model.c": self.build.source, "model.wasm": self.build.wasm, "weights.bin": self.build.weights}
        for header in runtime_headers(self.build.source):
            files[header.name] = header
        return files

    def artifact_meta(self) -> dict[str, Any]:
        """The backend's part of an artifact's meta.json: its files' roles and how the module was built."""
        return dict(self.facts)


# The roles of an artifact's files, by the name each has in the artifact.
ARTIFACT_FILES = {"source": "model.c", "header": "cuvil_api.h", "library": "model.wasm", "weights": "weights.bin"}


def build_facts(zig: Zig) -> dict[str, Any]:
    """How a module was built, as saved in an artifact: compiler, flags, and a command that rebuilds it."""
    # The build adds -I<installed runtime>; a saved artifact holds its headers beside model.c instead.
    flags = [f for f in compile_flags() if not f.startswith("-I")]
    command = ["python", "-m", "ziglang", "cc"]
    cmd = [*command, *flags, ARTIFACT_FILES["source"], "-o", ARTIFACT_FILES["library"]]
    return {
        "backend": "wasm",
        "files": dict(ARTIFACT_FILES),
        "compiler": {"command": command, "version": zig.version, "flags": flags},
        "rebuild": " ".join(shlex.quote(c) for c in cmd),
    }


def load_executor(folder: Path, meta: Mapping[str, Any]) -> WasmExecutor:
    """The executor of a saved artifact (meta.json already checked by cuvil.runtime.artifact)."""
    files = meta["files"]
    if dict(files) != ARTIFACT_FILES:
        raise ModelError(f"{folder}: meta.json lists files {dict(files)}; a wasm artifact holds {ARTIFACT_FILES}")
    b = WasmBuild(folder, cached=True, seconds=0.0)
    return WasmExecutor(b, {k: meta[k] for k in ("backend", "files", "compiler", "rebuild")})

"""The C backend: a graph to one C file, compiled with the system C compiler, loaded with ctypes."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuvil import __version__
from cuvil.backends.c import cache
from cuvil.backends.c.codegen import CodegenOptions, GeneratedModule, generate
from cuvil.backends.c.library import NativeModel
from cuvil.backends.c.toolchain import RUNTIME_DIR, Compiler, build_library, compile_flags
from cuvil.ir.graph import Graph

C_TARGETS = ("generic", "x86_avx2", "x86_avx512", "native")


@dataclass(frozen=True)
class BuildOptions:
    target: str = "generic"
    compiler: Compiler = Compiler()
    cache_dir: Path | None = None
    sanitize: bool = False


@dataclass
class Build:
    """A built model: its folder (source, library, weights) and how long the build took."""

    folder: Path
    cached: bool
    seconds: float
    module: GeneratedModule | None = None

    @property
    def library(self) -> Path:
        return self.folder / "model.so"

    @property
    def weights(self) -> Path:
        return self.folder / "weights.bin"

    @property
    def source(self) -> Path:
        return self.folder / "model.c"


def _runtime_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(RUNTIME_DIR.iterdir()):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def build(graph: Graph, options: BuildOptions) -> Build:
    """Generate, compile (or fetch from the cache) and return the model's build folder."""
    t0 = time.perf_counter()
    module = generate(graph, CodegenOptions(target=options.target, model_name=graph.name))
    h = hashlib.sha256()
    for part in (module.source, __version__, options.target, options.compiler.version, " ".join(options.compiler.argv),
                 " ".join(compile_flags(options.target, sanitize=options.sanitize)), _runtime_digest()):
        h.update(part.encode())
        h.update(b"\0")
    h.update(hashlib.sha256(module.weights).digest())
    key = h.hexdigest()

    def make(folder: Path) -> None:
        src = folder / "model.c"
        src.write_text(module.source, encoding="utf-8")
        (folder / "weights.bin").write_bytes(module.weights)
        build_library(options.compiler, src, folder / "model.so", options.target, sanitize=options.sanitize)

    root = options.cache_dir or cache.default_cache_dir()
    folder, hit = cache.get_or_build(root, key, make)
    return Build(folder, hit, time.perf_counter() - t0, module)


class CExecutor:
    """Runs a built model library."""

    def __init__(self, b: Build) -> None:
        self.build = b
        self.native = NativeModel(b.library, b.weights)

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return self.native.run(inputs)


def write_meta(path: Path, meta: dict[str, object]) -> None:
    path.write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")

"""The CUDA backend: a graph to one CUDA translation unit (device kernels and a host function with
the C target's API), built by nvcc for a GPU, by the host C++ compiler against the CPU execution
harness (``cuda-sim``), or written with its hipcc command (``hip``); loaded with the C backend's
ctypes loader."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuvil._version import __version__
from cuvil.backends.c import cache
from cuvil.backends.c.codegen import GeneratedModule
from cuvil.backends.c.library import NativeModel
from cuvil.backends.c.toolchain import INCLUDE_RE
from cuvil.backends.c.toolchain import RUNTIME_DIR as C_RUNTIME_DIR
from cuvil.backends.cuda import toolchain
from cuvil.backends.cuda.codegen import CudaCodegenOptions, generate
from cuvil.errors import CuvilError, ModelError
from cuvil.ir.graph import Graph
from cuvil.log import stage
from cuvil.runtime.compiled import BuildInfo

_log = logging.getLogger(__name__)

# The roles of an artifact's files, by the name each has in the artifact.
ARTIFACT_FILES = {"source": "model.cu", "header": "cuvil_api.h", "library": "model.so", "weights": "weights.bin"}
HIP_FILES = {"source": "model.cu", "header": "cuvil_api.h", "weights": "weights.bin", "build": "build.sh"}


@dataclass(frozen=True)
class CudaBuildOptions:
    target: str = "cuda"
    cache_dir: Path | None = None
    faults: frozenset[str] = frozenset()
    options_key: str = ""  # CompileOptions.build_key: part of the build-cache key


@dataclass
class CudaBuild(cache.BuildFolder):
    module: GeneratedModule | None = None
    target: str = "cuda"
    compiled: bool = True  # False: the source alone (hip: hipcc is not run here)

    @property
    def library(self) -> Path:
        return self.folder / "model.so"


def build(graph: Graph, options: CudaBuildOptions, *, compile_it: bool = True) -> CudaBuild:
    """Generate and compile (or fetch from the cache) the model's build folder; ``compile_it``
    False writes the source and weights only."""
    t0 = time.perf_counter()
    with stage(_log, "cuda codegen"):
        module = generate(graph, CudaCodegenOptions(target=options.target, model_name=graph.name,
                                                    faults=options.faults))
    compiler = toolchain.compiler_for(options.target) if compile_it else "none"
    key_parts = (__version__, options.target, compiler, toolchain.compiler_version(compiler) if compile_it else "",
                 " ".join(toolchain.command(options.target, compiler, Path("model.c"), Path("model.so"))),
                 cache.runtime_digest(toolchain.RUNTIME_DIR), cache.runtime_digest(C_RUNTIME_DIR),
                 *((options.options_key,) if options.options_key else ()))

    def compile_source(src: Path, folder: Path) -> str:
        if not compile_it:
            return ""
        return toolchain.build_library(options.target, src, folder / "model.so")

    root = options.cache_dir or cache.default_cache_dir()
    folder, hit = cache.build_model_folder(root, module.source, module.weights, key_parts, compile_source)
    return CudaBuild(folder, hit, time.perf_counter() - t0, module, options.target, compile_it)


def runtime_headers(source: Path) -> list[Path]:
    """The runtime headers ``source`` includes, directly or through each other (beside it first,
    then the CUDA runtime, then the C runtime), in a stable order."""
    found: dict[str, Path] = {}
    todo = [source]
    while todo:
        text = todo.pop().read_text(encoding="utf-8")
        for name in INCLUDE_RE.findall(text):
            if name in found:
                continue
            for folder in (source.parent, *toolchain.INCLUDE_DIRS):
                if (folder / name).is_file():
                    found[name] = folder / name
                    todo.append(found[name])
                    break
            else:
                if name in ("cuvil_cuda.h", "cuvil_cuda_sim.h"):
                    continue  # the shim is installed with the harness; an artifact without it rebuilds elsewhere
                raise CuvilError(f"{source}: included header {name!r} is not in the Cuvil runtime")
    return [found[k] for k in sorted(found)]


class CudaExecutor:
    """Runs a built CUDA model library (through the C backend's loader: the same C API)."""

    enforces_run_limits = False  # no loops run in a CUDA model yet

    def __init__(self, b: CudaBuild, facts: Mapping[str, Any], *, library: Path | None = None,
                 unloadable: str | None = None) -> None:
        self.build = b
        self.unloadable = unloadable
        self.library = library or b.library
        self.native = None if unloadable else NativeModel(self.library, b.weights, 1)
        self.facts = dict(facts)

    def _loaded(self) -> NativeModel:
        if self.native is None:
            raise CuvilError(f"this build cannot run here: {self.unloadable}")
        return self.native

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return self._loaded().run(inputs)

    def build_info(self, target: str) -> BuildInfo:
        b = self.build
        return BuildInfo(target, b.folder, b.source, self.library, b.weights, b.weights.stat().st_size, b.cached,
                         None if b.module is None else tuple(b.module.line_origins),
                         None if self.native is None else 1)

    def loaded_weights(self) -> bytes | None:
        return None if self.native is None else self.native.loaded_weights()

    def artifact_files(self) -> dict[str, Path]:
        b = self.build
        roles = HIP_FILES if not b.compiled else ARTIFACT_FILES
        files = {roles["source"]: b.source, roles["weights"]: b.weights}
        if b.compiled:
            files[ARTIFACT_FILES["library"]] = b.library
        else:
            script = b.folder / "build.sh"
            script.write_text("#!/bin/sh\nset -e\ncd \"$(dirname \"$0\")\"\n" + self.facts["rebuild"] + "\n",
                              encoding="utf-8")
            files[HIP_FILES["build"]] = script
        for header in runtime_headers(b.source):
            files[header.name] = header
        return files

    def artifact_meta(self) -> dict[str, Any]:
        return dict(self.facts)


def build_facts(target: str, compiled: bool) -> dict[str, Any]:
    """How the library is (or is to be) built, as saved in an artifact."""
    compiler = toolchain.compiler_for(target)
    cmd = toolchain.command(target, Path(compiler).name, Path("model.cu"), Path("model.so"), artifact=True)
    facts: dict[str, Any] = {
        "backend": "cuda",
        "files": dict(ARTIFACT_FILES if compiled else HIP_FILES),
        "compiler": {"command": [Path(compiler).name], "flags": cmd[1:cmd.index("model.cu")]},
        "rebuild": " ".join(shlex.quote(c) for c in cmd),
    }
    if target == "hip":
        facts["note"] = "HIP source and its hipcc build command; compile-checked where hipcc exists, untested on AMD GPUs"
    return facts


def load_executor(folder: Path, meta: Mapping[str, Any]) -> CudaExecutor:
    """The executor of a saved CUDA artifact (meta.json already checked by cuvil.runtime.artifact)."""
    target = meta.get("target")
    if meta["files"] != ARTIFACT_FILES:
        raise ModelError(f"{folder}: meta.json lists files {meta['files']}; a CUDA artifact holds {ARTIFACT_FILES}")
    unloadable = None
    if target in toolchain.ARCH_FLAGS:
        unloadable = toolchain.gpu_missing()
    b = CudaBuild(folder, cached=True, seconds=0.0, target=str(target))
    facts = {k: meta[k] for k in ("backend", "files", "compiler", "rebuild") if k in meta}
    return CudaExecutor(b, facts, unloadable=unloadable)

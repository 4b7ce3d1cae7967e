"""The C backend: a graph to one C file, compiled with the system C compiler, loaded with ctypes."""

from __future__ import annotations

import json
import logging
import shlex
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil._version import __version__
from cuvil.backends.c import cache
from cuvil.backends.c.codegen import CodegenOptions, GeneratedModule, generate
from cuvil.backends.c.kernel_library import kernel_object
from cuvil.backends.c.library import MAX_RANK, NativeModel, ThreadStats
from cuvil.backends.c.toolchain import (
    INCLUDE_RE,
    RUNTIME_DIR,
    TARGET_VARIANTS,
    Compiler,
    Variant,
    build_library,
    compile_flags,
    variant_here,
    variants_for,
)
from cuvil.errors import CuvilError, ModelError
from cuvil.ir.graph import Graph
from cuvil.log import stage
from cuvil.runtime.artifact import ArtifactError
from cuvil.runtime.compiled import BuildInfo

_log = logging.getLogger(__name__)

@dataclass(frozen=True)
class BuildOptions:
    target: str = "generic"
    compiler: Compiler = field(default_factory=Compiler)
    cache_dir: Path | None = None
    sanitize: bool = False
    conv_algorithm: str | tuple[tuple[str, str], ...] = "auto"  # see kernels/conv_algorithm.py
    faults: frozenset[str] = frozenset()  # the compile's planted faults (cuvil/faults.py)
    # What of the compile options decides the generated code (CompileOptions.build_key): part of the
    # build-cache key beside the source, weights, compiler, flags and runtime.
    options_key: str = ""


@dataclass
class Build(cache.BuildFolder):
    """A built model library: its folder (source, library, weights, and the target's variant
    libraries this model has: ``toolchain.TARGET_VARIANTS``) and how long the build took."""

    module: GeneratedModule | None = None
    options: BuildOptions | None = None
    variants: tuple[Variant, ...] = ()

    @property
    def library(self) -> Path:
        """The base library: it runs on every CPU the target is for."""
        return self.folder / "model.so"

    def library_here(self) -> Path:
        """The library this machine's CPU loads: the most capable variant it runs, else the base."""
        v = variant_here(self.variants)
        return self.library if v is None else self.folder / v.library


def _runtime_digest() -> str:
    return cache.runtime_digest(RUNTIME_DIR)


def build(graph: Graph, options: BuildOptions) -> Build:
    """Generate, compile (or fetch from the cache) and return the model's build folder."""
    t0 = time.perf_counter()
    with stage(_log, "codegen"):
        module = generate(graph, CodegenOptions(target=options.target, model_name=graph.name,
                                                conv_algorithm=options.conv_algorithm, faults=options.faults))
    variants = variants_for(options.target, module.source)
    key_parts = (__version__, options.target, options.compiler.version, " ".join(options.compiler.argv),
                 *(" ".join(compile_flags(options.target, sanitize=options.sanitize, variant=v))
                   for v in (None, *variants)), _runtime_digest(), "kernel-library",
                 *((options.options_key,) if options.options_key else ()))

    root = options.cache_dir or cache.default_cache_dir()

    def compile_source(src: Path, folder: Path) -> str:
        logs = []
        for v in (None, *variants):
            flags = compile_flags(options.target, sanitize=options.sanitize, variant=v)
            logs.append(build_library(options.compiler, src, folder / (v.library if v else "model.so"),
                                      options.target, sanitize=options.sanitize, variant=v,
                                      kernels=kernel_object(options.compiler, flags, root)))
        return "".join(logs)

    t1 = time.perf_counter()
    folder, hit = cache.build_model_folder(root, module.source, module.weights, key_parts, compile_source)
    _log.debug("stage %s: %.1f ms (%s)", "cache hit" if hit else "c build", (time.perf_counter() - t1) * 1e3, folder)
    for v in variants:
        _log.info("%s: the build has a library for CPUs with %s too (%s)", options.target,
                  ", ".join(sorted(v.features)), v.library)
    return Build(folder, hit, time.perf_counter() - t0, module, options, variants)


class CExecutor:
    """Runs a built model library."""

    enforces_run_limits = True  # cuvil_set_run_limits, around each call (cuvil/limits.py)

    def __init__(self, b: Build, facts: Mapping[str, Any] | None = None, *, library: Path | None = None,
                 num_threads: int | None = None, unloadable: str | None = None) -> None:
        """``unloadable``: why this machine cannot load the library (a build for another CPU, to be
        saved and run there); then it is not loaded, and running it raises that."""
        self.build = b
        self.unloadable = unloadable
        self.library = library or b.library_here()
        self.native = None if unloadable else NativeModel(self.library, b.weights, num_threads)
        if facts is None:
            if b.options is None:
                raise CuvilError("a C build needs its build options or saved facts")
            facts = build_facts(b.options, b.variants)
        self.facts = dict(facts)

    def _loaded(self) -> NativeModel:
        if self.native is None:
            raise CuvilError(f"this build cannot run here: {self.unloadable}")
        return self.native

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return self._loaded().run(inputs)

    def build_info(self, target: str) -> BuildInfo:
        """What ``CompiledModel.build_info`` reports for this build."""
        b = self.build
        return BuildInfo(target, b.folder, b.source, self.library, b.weights, b.weights.stat().st_size, b.cached,
                         None if b.module is None else tuple(b.module.line_origins),
                         None if self.native is None else self.native.num_threads)

    def loaded_weights(self) -> bytes | None:
        return None if self.native is None else self.native.loaded_weights()

    def thread_stats(self) -> ThreadStats | None:
        return None if self.native is None else self.native.thread_stats()

    def set_split_policy(self, policy: str) -> None:
        self._loaded().set_split_policy(policy)

    # what an artifact (cuvil/runtime/artifact.py) needs --------------------------
    def artifact_files(self) -> dict[str, Path]:
        """Every file a saved artifact holds, by its name there: source, headers, library, weights."""
        files = {"model.c": self.build.source, "model.so": self.build.library, "weights.bin": self.build.weights}
        for v in self.build.variants:
            files[v.library] = self.build.folder / v.library
        for header in runtime_headers(self.build.source):
            files[header.name] = header
        return files

    def artifact_meta(self) -> dict[str, Any]:
        """The backend's part of an artifact's meta.json: its files' roles and how the library was built."""
        return dict(self.facts)


# The roles of an artifact's files, by the name each has in the artifact.
ARTIFACT_FILES = {"source": "model.c", "header": "cuvil_api.h", "library": "model.so", "weights": "weights.bin"}


def build_facts(options: BuildOptions, variants: tuple[Variant, ...] = ()) -> dict[str, Any]:
    """How a library was built, as saved in an artifact: compiler, flags, and a command that rebuilds
    it; and for each variant library, the CPU features that load it and its own command."""

    def command(variant: Variant | None) -> tuple[list[str], str]:
        # The build adds -I<installed runtime>; a saved artifact holds its headers beside model.c instead.
        flags = [f for f in compile_flags(options.target, sanitize=options.sanitize, variant=variant)
                 if not f.startswith("-I")]
        out = variant.library if variant else ARTIFACT_FILES["library"]
        cmd = [*options.compiler.argv, *flags, ARTIFACT_FILES["source"], "-o", out, "-lm"]
        return flags, " ".join(shlex.quote(c) for c in cmd)

    flags, rebuild = command(None)
    facts: dict[str, Any] = {
        "backend": "c",
        "files": dict(ARTIFACT_FILES),
        "compiler": {"command": list(options.compiler.argv), "version": options.compiler.version, "flags": flags},
        "rebuild": rebuild,
    }
    if variants:
        facts["files"].update({_variant_role(v): v.library for v in variants})
        facts["variants"] = [{"name": v.name, "library": v.library, "needs": sorted(v.features),
                              "rebuild": command(v)[1]} for v in variants]
    return facts


def _variant_role(v: Variant) -> str:
    return f"library.{v.name}"


def runtime_headers(source: Path) -> list[Path]:
    """The runtime headers ``source`` includes, directly or through each other, in a stable order.

    Each is looked for beside ``source`` first (a saved artifact), then in the installed runtime."""
    found: dict[str, Path] = {}
    todo = [source]
    while todo:
        text = todo.pop().read_text(encoding="utf-8")
        for name in INCLUDE_RE.findall(text):
            if name in found:
                continue
            for folder in (source.parent, RUNTIME_DIR):
                if (folder / name).is_file():
                    found[name] = folder / name
                    todo.append(found[name])
                    break
            else:
                raise CuvilError(f"{source}: included header {name!r} is not in the Cuvil runtime")
    return [found[k] for k in sorted(found)]


def load_executor(folder: Path, meta: Mapping[str, Any]) -> CExecutor:
    """The executor of a saved artifact (meta.json already checked by cuvil.runtime.artifact)."""
    target = meta.get("target")
    known = {v.name: v for v in TARGET_VARIANTS.get(target, ())} if isinstance(target, str) else {}
    listed = meta.get("variants", [])
    if not isinstance(listed, list) or not all(isinstance(e, dict) and e.get("name") in known for e in listed):
        raise ModelError(f"{folder}: meta.json lists variant libraries {listed!r}; a C artifact for {target} may hold "
                         f"{sorted(known) or 'none'}")
    variants = tuple(known[e["name"]] for e in listed)
    expected = {**ARTIFACT_FILES, **{_variant_role(v): v.library for v in variants}}
    if meta["files"] != expected:
        raise ModelError(f"{folder}: meta.json lists files {meta['files']}; a C artifact holds {expected}")
    missing = [k for k in ("compiler", "rebuild") if k not in meta]
    if missing:
        raise ModelError(f"{folder}: meta.json lacks {', '.join(missing)}, which a C artifact records")
    b = Build(folder, cached=True, seconds=0.0, variants=variants)
    library = b.library_here()
    # The dynamic loader knows a library by its path: a second dlopen of the same path returns the library
    # already mapped, even when a newer artifact has replaced the file since (ctypes never unloads). Opening
    # it through a link of a unique name makes every load map the file that is there now.
    with tempfile.TemporaryDirectory(prefix="cuvil-load-") as tmp:
        link = Path(tmp) / library.name
        link.symlink_to(library.resolve())
        facts = {k: meta[k] for k in ("backend", "files", "compiler", "rebuild", "variants") if k in meta}
        try:
            executor = CExecutor(b, facts, library=link)
        except CuvilError as exc:
            raise ArtifactError(f"{folder}: cannot load {library.name}: {exc}") from None
    executor.library = library
    if executor.native is not None:
        check_library_facts(executor.native, meta, folder)
    return executor


def check_library_facts(native: NativeModel, meta: Mapping[str, Any], folder: Path) -> None:
    """Refuse an artifact whose meta.json disagrees with what its library says about itself.

    The Python side sizes its descriptors and checks inputs from meta.json, the library reads
    what it was generated for: a count, element type, rank or target they disagree on would be
    read past or misread.  (A library without ``cuvil_signature``, from an older Cuvil, is
    compared on its counts alone.)"""
    def refuse(what: str) -> ArtifactError:
        return ArtifactError(f"{folder}: meta.json disagrees with {native.path.name}: {what}")

    for side, count in (("inputs", native.n_inputs), ("outputs", native.n_outputs)):
        listed = meta[side]
        for k, entry in enumerate(listed):
            if len(entry["shape"]) > MAX_RANK:
                raise refuse(f"{side} {k} ({entry.get('name')!r}) has rank {len(entry['shape'])}; the runtime "
                             f"takes at most {MAX_RANK}")
        if len(listed) != count:
            raise refuse(f"it lists {len(listed)} {side}, the library has {count}")
    sig = native.signature
    if sig is None:
        return
    if sig.target != meta["target"]:
        raise refuse(f"\"target\" is {meta['target']!r}, the library was built for {sig.target!r}")
    for side, facts in (("inputs", sig.inputs), ("outputs", sig.outputs)):
        for k, (entry, (dtype, rank)) in enumerate(zip(meta[side], facts)):
            given = (str(entry["dtype"]), len(entry["shape"]))
            if given != (dtype, rank):
                raise refuse(f"{side} {k} ({entry.get('name')!r}) is listed as {given[0]} of rank {given[1]}, the "
                             f"library's is {dtype} of rank {rank}")


def write_meta(path: Path, meta: dict[str, object]) -> None:
    path.write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")

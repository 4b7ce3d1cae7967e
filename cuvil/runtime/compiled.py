"""CompiledModel: the callable that ``cuvil.compile`` and ``cuvil.load`` return, and what it
tells about its build (:class:`BuildInfo`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cuvil.errors import CuvilError, InputError
from cuvil.ir.assumptions import Assumption
from cuvil.ir.graph import Graph
from cuvil.ir.spec import TensorSpec
from cuvil.ir.types import SymbolInfo
from cuvil.limits import RunLimits, applied
from cuvil.ops.common import graph_assumptions
from cuvil.runtime.guards import bind_inputs
from cuvil.runtime.torch_io import inputs_to_numpy, outputs_as


class Executor(Protocol):
    """What a backend provides: run validated inputs, return outputs."""

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class BuildInfo:
    """What a C or wasm32 build made and where it lies (``CompiledModel.build_info``).

    For a model loaded from an artifact, the paths are the artifact's files and ``line_origins``
    is None (the map is not saved)."""

    target: str
    folder: Path  # the build-cache folder, or the artifact folder of a loaded model
    source: Path  # the generated C (model.c)
    library: Path  # what runs: model.so (or the variant this CPU loads, as model.avx512vnni.so), model.wasm for wasm32
    weights: Path  # the weights blob (weights.bin) the library loads at start-up
    weights_bytes: int
    cached: bool  # the build came from the build cache (always true for a loaded artifact)
    # Per line of ``source`` (0-based), the name of the IR node it was generated for, or None.
    line_origins: tuple[str | None, ...] | None = field(repr=False)
    # threads each call runs on, at the time of asking (1 for wasm32; None: a build for another CPU, not loaded)
    num_threads: int | None

    @property
    def warnings(self) -> str:
        """What the C compiler printed when building (empty when the code compiled cleanly)."""
        log = self.folder / "build.log"
        return log.read_text(encoding="utf-8") if log.is_file() else ""

    def line_of(self, node_name: str) -> int | None:
        """The 1-based line of ``source`` where the code of node ``node_name`` begins, or None
        (unknown node, or no line map)."""
        if self.line_origins is None:
            return None
        for i, origin in enumerate(self.line_origins):
            if origin == node_name:
                return i + 1
        return None


@runtime_checkable
class BuildExecutor(Protocol):
    """An executor that runs a build it can describe (the C and wasm32 backends)."""

    def build_info(self, target: str) -> BuildInfo: ...


@runtime_checkable
class WeightsExecutor(Protocol):
    """An executor whose loaded library can show its weights buffer (the native C backend)."""

    def loaded_weights(self) -> bytes | None: ...


@runtime_checkable
class ThreadStatsExecutor(Protocol):
    """An executor whose library counts what its worker threads did and takes a split policy (the native C
    backend)."""

    def thread_stats(self) -> Any: ...

    def set_split_policy(self, policy: str) -> None: ...


@dataclass(frozen=True)
class Signature:
    """A model's contract: its inputs, outputs and the constraints of its symbols."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    symbols: Mapping[str, SymbolInfo] = field(default_factory=dict)
    # Shape relations between symbolic dims checked before anything runs (cuvil/ir/assumptions.py).
    checks: tuple[Assumption, ...] = ()
    # A symbol whose upper bound is not checked: only a compile that plants the fault "drop-guard"
    # (cuvil/faults.py) sets it, so that its Python guard has the bug its C guard has.
    dropped_guard: str | None = None
    # What a call does instead of running: only a C build that plants "native-crash" or "native-hang"
    # (cuvil/faults.py) sets it; saved with an artifact, so the loaded model has the bug too.
    call_fault: str | None = None

    @staticmethod
    def of(graph: Graph, planted: frozenset[str] = frozenset()) -> Signature:
        """The contract of ``graph``; ``planted``: the compile's planted faults."""
        from cuvil.runtime.guards import dropped_guard

        return Signature(
            tuple(TensorSpec(v.name, v.type) for v in graph.inputs),
            tuple(TensorSpec(v.name, v.type) for v in graph.outputs),
            dict(graph.symbols),
            tuple(graph_assumptions(graph)),
            dropped_guard(graph.symbols, planted) if planted else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": [s.to_json() for s in self.inputs],
            "outputs": [s.to_json() for s in self.outputs],
            "symbols": [
                {"name": i.name, "min": i.min, "max": i.max, "multiple_of": i.multiple_of} for i in self.symbols.values()
            ],
            "checks": [c.to_json() for c in self.checks],
            **({"dropped_guard": self.dropped_guard} if self.dropped_guard is not None else {}),
            **({"call_fault": self.call_fault} if self.call_fault is not None else {}),
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Signature:
        return Signature(
            tuple(TensorSpec.from_json(x) for x in d["inputs"]),
            tuple(TensorSpec.from_json(x) for x in d["outputs"]),
            {s["name"]: SymbolInfo(s["name"], s.get("min"), s.get("max"), s.get("multiple_of")) for s in d["symbols"]},
            tuple(Assumption.from_json(c) for c in d.get("checks", [])),
            d.get("dropped_guard"),
            d.get("call_fault"),
        )


@dataclass(frozen=True)
class CompileInfo:
    """Where a compiled model came from and what compiling it took (saved in an artifact's meta.json)."""

    model_name: str | None = None  # the graph's name
    # "onnx file", "onnx bytes", "onnx model", "cuvil graph", "pytorch module", "torchscript module" or "torchscript file"
    source_kind: str | None = None
    source_sha256: str | None = None  # of the model file's bytes, the serialized ModelProto, or the IR text
    seconds: float | None = None  # import + code generation + C build (or cache lookup)
    cached: bool | None = None  # the build came from the build cache (None: the target has no build)
    compiled_at: str | None = None  # UTC, ISO 8601
    notes: tuple[str, ...] = ()  # what the user should know about how it was compiled (options without effect ...)
    # A reduced-precision or quantized compile's accuracy report against the float32 graph
    # (cuvil.quant.accuracy.PrecisionReport.to_json()); None for a float32 compile.
    precision: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "source_kind": self.source_kind, "source_sha256": self.source_sha256,
                "seconds": self.seconds, "cached": self.cached, "compiled_at": self.compiled_at,
                "notes": list(self.notes), "precision": None if self.precision is None else dict(self.precision)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> CompileInfo:
        seconds = d.get("seconds")
        return CompileInfo(d.get("model_name"), d.get("source_kind"), d.get("source_sha256"),
                           None if seconds is None else float(seconds), d.get("cached"), d.get("compiled_at"),
                           tuple(str(n) for n in d.get("notes", ())), d.get("precision"))


class CompiledModel:
    """A model compiled for one target. Call it with arrays in graph-input order."""

    def __init__(self, signature: Signature, executor: Executor, target: str, graph: Graph | None = None,
                 info: CompileInfo | None = None) -> None:
        self.signature = signature
        self.target = target
        self.graph = graph
        self.info = info or CompileInfo()
        self._executor = executor
        self.input_specs = list(signature.inputs)
        self.output_specs = list(signature.outputs)

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.input_specs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.output_specs]

    @property
    def symbols(self) -> dict[str, SymbolInfo]:
        return dict(self.signature.symbols)

    @property
    def memory_plan(self) -> Any:
        """Where the intermediates live in each call's arena (a ``cuvil.backends.c.memplan.MemoryPlan``:
        ``arena_bytes()``, ``lower_bound_bytes()``, ``value_layout()``, ``largest_free_block()``,
        ``fragmentation()``, ``format()``, each at given ``dims`` or the symbols' maxima), or None when the
        pipeline had no ``plan-memory`` pass, or for a model loaded from an artifact."""
        return None if self.graph is None else self.graph.memory_plan

    @property
    def build_info(self) -> BuildInfo | None:
        """The build this model runs (source, line map, weights, library, cache hit), or None for
        targets without one (``ref``)."""
        ex = self._executor
        return ex.build_info(self.target) if isinstance(ex, BuildExecutor) else None

    def loaded_weights(self) -> bytes | None:
        """The weights as the loaded library holds them in memory now, or None where the backend
        does not show them (only native C does): lets verification check that no run writes them."""
        ex = self._executor
        return ex.loaded_weights() if isinstance(ex, WeightsExecutor) else None

    def thread_stats(self) -> Any:
        """What this model's worker threads did since they started: a
        ``cuvil.backends.c.library.ThreadStats`` (calls, regions run threaded and declined, the share of
        tasks the workers ran, the callers' waits for them), or None where the backend does not count
        them (only native C does).  Two readings around some calls, ``after.since(before)``, tell why
        those calls did or did not gain from more threads."""
        ex = self._executor
        return ex.thread_stats() if isinstance(ex, ThreadStatsExecutor) else None

    def set_split_policy(self, policy: str) -> None:
        """How calls split their kernels' work over the model's threads: "auto" (the default: the
        cost model declines regions too small to pay, or while the workers answer slowly) or
        "always" (every region that can split does, whatever the machine's load: which regions
        thread is then deterministic, for tests).  Only the native C backend has threads to split
        over; elsewhere this raises ``CuvilError``.  Not while calls run."""
        ex = self._executor
        if not isinstance(ex, ThreadStatsExecutor):
            raise CuvilError(f"the {self.target} backend runs no threads: it has no split policy")
        ex.set_split_policy(policy)

    def __call__(self, *arrays: Any) -> list[Any]:
        """Run on inputs in graph-input order: NumPy arrays (or array-likes) or torch tensors.

        Outputs are torch tensors when any input was one (sharing memory with
        the backend's arrays), NumPy arrays otherwise."""
        if self.signature.call_fault is not None:  # a planted fault (cuvil/faults.py): never set otherwise
            from cuvil.faults import trip

            trip(self.signature.call_fault)
        want = self.__dict__.get("_static_inputs")
        if want and len(arrays) == len(want):
            # the serving loop's call: NumPy arrays of exactly the static input types need no
            # conversion and no checks beyond these (the backend makes non-contiguous ones contiguous)
            for a, (dt, shape) in zip(arrays, want):
                if type(a) is not np.ndarray or a.dtype != dt or a.shape != shape:
                    break
            else:
                return self._executor.run(list(arrays), {})
        arrs, torch_out = inputs_to_numpy(arrays, self.input_names)
        if not self._matches_static(arrs):
            env = bind_inputs(self.input_names, [s.type for s in self.input_specs], arrs, self.signature.symbols,
                              self.signature.checks, self.signature.dropped_guard)
        else:
            env = {}
        return outputs_as(self._executor.run(arrs, env), torch_out)

    def _matches_static(self, arrays: list[np.ndarray]) -> bool:
        """Whether the inputs have exactly the dtypes and shapes of a model whose inputs are all
        static (then there is nothing else to check); False sends them through ``bind_inputs``,
        which also explains any mismatch."""
        want = self.__dict__.get("_static_inputs", False)
        if want is False:
            want = None
            if not self.signature.symbols and not self.signature.checks:
                try:
                    want = [(np.dtype(s.type.dtype.np), tuple(s.type.shape)) for s in self.input_specs
                            if all(isinstance(d, int) for d in s.type.shape) and s.type.dtype.np is not None]
                except TypeError:
                    want = None
                if want is not None and len(want) != len(self.input_specs):
                    want = None
            self.__dict__["_static_inputs"] = want
        if want is None or len(arrays) != len(want):
            return False
        return all(a.dtype == dt and a.shape == shape for a, (dt, shape) in zip(arrays, want))

    def run(self, inputs: Mapping[str, Any], *, max_loop_iterations: int | None = None,
            max_output_bytes: int | None = None) -> dict[str, Any]:
        """Run on inputs by name; the limits (off by default) bound the model's loops (cuvil/limits.py)."""
        limits = RunLimits(max_loop_iterations, max_output_bytes)
        if limits.any and not getattr(self._executor, "enforces_run_limits", False):
            raise CuvilError(f"target {self.target!r} does not enforce max_loop_iterations or max_output_bytes")
        with applied(limits):
            return self._run(inputs)

    def _run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        missing = [n for n in self.input_names if n not in inputs]
        extra = [n for n in inputs if n not in self.input_names]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing {', '.join(map(repr, missing))}")
            if extra:
                parts.append(f"unknown {', '.join(map(repr, extra))}")
            raise InputError(f"inputs do not match the model: {'; '.join(parts)}; expected {self.input_names}")
        outs = self(*[inputs[n] for n in self.input_names])
        return dict(zip(self.output_names, outs))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save as an artifact folder that ``cuvil.load`` reads back (see cuvil/runtime/artifact.py)."""
        from cuvil.runtime.artifact import save

        return save(self, path)

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.type}" for s in self.input_specs)
        return f"CompiledModel(target={self.target!r}, inputs=({ins}))"

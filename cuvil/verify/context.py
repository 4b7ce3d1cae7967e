"""What every check sees: the model, its Cuvil graph, the targets, seeded inputs and oracles.

The source is imported once (a PyTorch module exported once, with the torch front
end's op-mapping table kept for the ``coverage`` check) and compiled models are cached
per (target, options), so checks that need the same build share it; every build is
timed in ``builds`` (the runner attributes them to the check that asked first).
Builds can be started ahead, in background threads (:meth:`VerifyContext.prefetch`:
the C compiler and zig run as separate processes, so builds overlap each other and
the checks that do not time anything); :meth:`VerifyContext.compiled` waits for a
started build rather than making it again, and raises what the build raised.
Oracles: the reference interpreter (Cuvil's semantics,
optionally in float64), and the source framework the model came from
(onnxruntime for ONNX files, eager PyTorch for PyTorch modules).
"""

from __future__ import annotations

import contextvars
import copy
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from cuvil.ir.dim_domains import DimAnalysis, DimDomain
from cuvil.ir.domains import DEFAULT, Domain, infer_domains
from cuvil.ir.graph import Graph
from cuvil.ir.samples import random_inputs
from cuvil.options import CompileOptions
from cuvil.runtime.compiled import CompiledModel, Signature
from cuvil.verify.base import VerifyError


@dataclass
class ModelSource:
    """The model under verification, as the user gave it."""

    kind: str  # "onnx" | "torch" | "tensorflow" | "graph"
    model: Any
    input_spec: Any = None
    dynamic_shapes: Any = None
    label: str = "model"


def _observed(arrays: Sequence[np.ndarray]) -> Domain:
    """The domain the user's samples of one input span: its few distinct values, else its range."""
    values = np.unique(np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64))
    if arrays[0].dtype.kind in "iub" and len(values) <= 2:
        return Domain("user data", values=tuple(float(v) for v in values))
    if not len(values):
        return Domain("user data")
    return Domain("user data", low=float(values[0]), high=float(values[-1]))


@dataclass
class VerifyContext:
    source: ModelSource
    targets: list[str]
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    work_dir: Path = field(default_factory=lambda: Path("."))
    cache_dir: str | None = None
    _graph: Graph | None = None
    # Whether the subject refuses symbol values outside their constraints (Cuvil's guards do; a
    # runtime given an ONNX model, which declares no ranges, cannot).
    enforces_constraints: ClassVar[bool] = True
    _builds: dict[tuple[str, tuple[tuple[str, Any], ...]], CompiledModel] = field(default_factory=dict)
    _imported: Graph | None = None
    _torch: Any = None
    _tensorflow: Any = None
    #: Every build made through :meth:`compiled`, in order: target, options and seconds (import included
    #: for the first one).
    builds: list[dict[str, Any]] = field(default_factory=list)
    _pending: dict[tuple[str, tuple[tuple[str, Any], ...]], Future[tuple[CompiledModel, float]]] = field(
        default_factory=dict)
    _pool: ThreadPoolExecutor | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _domains: dict[str, Domain] | None = None
    _user: list[list[np.ndarray]] | None = None
    _dims: DimAnalysis | None = None

    def check_config(self, name: str) -> dict[str, Any]:
        """The ``[checks.NAME]`` table of the configuration (thresholds and options)."""
        checks = self.config.get("checks", {})
        return dict(checks.get(name, {})) if isinstance(checks, Mapping) else {}

    @property
    def graph(self) -> Graph:
        """The model's Cuvil graph (imported once, verified)."""
        if self._graph is None:
            self._graph = self.compiled("ref").graph
            if self._graph is None:
                raise VerifyError("the reference build has no graph")
        return self._graph

    @property
    def torch_import(self) -> Any:
        """A PyTorch source exported and converted once (cuvil.frontends.torch.TorchImport): its graph,
        ExportedProgram and the FX node behind each value. Every build compiles (a copy of) its graph."""
        if self.source.kind != "torch":
            raise VerifyError(f"{self.source.label} is not a PyTorch module")
        if self._torch is None:
            from cuvil.frontends.torch import load_torch

            self._torch = load_torch(self.source.model, self.source.input_spec, self.source.dynamic_shapes)
        return self._torch

    @property
    def tensorflow_import(self) -> Any:
        """A TensorFlow source converted once (cuvil.frontends.tensorflow.TensorFlowImport): its graph,
        the ONNX model tf2onnx wrote, the Keras layer of each node and the inference function."""
        if self.source.kind != "tensorflow":
            raise VerifyError(f"{self.source.label} is not a TensorFlow model")
        if self._tensorflow is None:
            from cuvil.frontends.tensorflow import load_tensorflow

            self._tensorflow = load_tensorflow(self.source.model, self.source.input_spec)
        return self._tensorflow

    @property
    def torch_mappings(self) -> list[Any]:
        """The torch front end's op-mapping table from converting :attr:`torch_import` (one
        ``cuvil.frontends.torch.OpMapping`` per FX node; the import is made if needed)."""
        return list(self.torch_import.mappings)

    def imported(self) -> Graph:
        """The source model as a Cuvil graph, imported once and shared by every build (compile copies it),
        its symbols constrained by the bounds ``[inputs.NAME] dims`` declares."""
        if self._imported is None:
            src = self.source
            if src.kind == "torch":
                self._imported = self.torch_import.graph
            elif src.kind == "tensorflow":
                self._imported = self.tensorflow_import.graph
            elif src.kind == "onnx":
                from cuvil.api import import_model

                self._imported = import_model(src.model)
            else:
                self._imported = copy.deepcopy(src.model)
            dims = self.config.get("dims", {})
            if dims:  # the declared bounds are the contract every build is compiled to (as --dim is)
                from cuvil.verify.dims import constrain

                constrain(self._imported, dims)
        assert self._imported is not None
        return self._imported

    def compiled(self, target: str, **options: Any) -> CompiledModel:
        """The model compiled for ``target`` with ``options`` (cached; the source is imported once)."""
        key = (target, tuple(sorted(options.items())))
        if key not in self._builds:
            t0 = time.perf_counter()
            with self._lock:
                pending = self._pending.pop(key, None)
            if pending is not None:
                model, seconds = pending.result()
                waited: float | None = time.perf_counter() - t0
            else:
                model, seconds = self._build(target, options)
                waited = None
            self._builds[key] = model
            self.builds.append({"target": target, "options": {k: repr(v) for k, v in options.items()},
                                "seconds": seconds, "background": pending is not None,
                                **({"waited": waited} if waited is not None else {})})
        return self._builds[key]

    def prefetch(self, requests: Iterable[tuple[str, Mapping[str, Any]]], *, workers: int | None = None) -> None:
        """Start building each (target, options) in a background thread, in the order given (``workers``
        at a time, default: one per CPU).  The source is imported first, on this thread."""
        todo: list[tuple[tuple[str, tuple[tuple[str, Any], ...]], dict[str, Any]]] = []
        for target, options in requests:
            key = (target, tuple(sorted(options.items())))
            if key not in self._builds and key not in self._pending and key not in [k for k, _ in todo]:
                todo.append((key, dict(options)))
        if not todo:
            return
        try:
            self.imported()
        except Exception:
            return  # the checks that need the import meet the same error and report it
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 2,
                                            thread_name_prefix="cuvil-verify-build")
        with self._lock:
            for key, options in todo:
                # each build runs in a copy of this thread's context: the faults cuvil.faults.plant
                # plants here are planted in the background builds too
                self._pending[key] = self._pool.submit(contextvars.copy_context().run, self._build, key[0], options)

    def settle(self) -> None:
        """Wait until every build started by :meth:`prefetch` has finished (failed ones fail when asked for)."""
        with self._lock:
            pending = list(self._pending.values())
        for f in pending:
            f.exception()

    def close(self) -> None:
        """Stop the background builds not yet started and wait for the running ones."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._lock:  # a build cancelled before it started is made on demand again
            self._pending = {k: f for k, f in self._pending.items() if not f.cancelled()}

    def compile_options(self, target: str, **options: Any) -> CompileOptions:
        """The options :meth:`compiled` compiles ``target`` with for the keyword ``options`` (the build
        cache, and the suite's sample inputs for a reduced-precision compile's overflow check): what a
        check gives ``cuvil.pipeline.build_pipeline`` to know the pipeline that build runs."""
        from cuvil.backends.registry import find_backend

        kw: dict[str, Any] = dict(options)
        backend = find_backend(target)  # None: a name compile refuses, and says so
        if (backend is None or backend.builds) and self.cache_dir:
            kw.setdefault("cache_dir", self.cache_dir)
        if kw.get("precision", "fp32") != "fp32" and "calibration_dataset" not in kw:
            # a reduced-precision compile looks for overflows on sample inputs: the suite's own, in
            # the model's value domain (see inputs), not values the model never sees
            kw["calibration_dataset"] = [tuple(self._samples(self.seed + i)) for i in range(2)]
        return CompileOptions.from_keywords(**kw)

    def _build(self, target: str, options: Mapping[str, Any]) -> tuple[CompiledModel, float]:
        import cuvil

        opts = self.compile_options(target, **options)
        t0 = time.perf_counter()
        model = cuvil.compile(self.imported(), target=target, options=opts)
        return model, time.perf_counter() - t0

    def inputs(self, seed: int | None = None, symbols: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """Seeded random inputs that satisfy the model's contract, each drawn from its domain
        (:meth:`input_domains`: declared, an example's, inferred from the graph), at the extents
        :meth:`symbol_values` gives (``symbols`` held, the others where the graph is valid)."""
        return self._samples(self.seed if seed is None else seed, symbols)

    def _samples(self, seed: int, symbols: Mapping[str, int] | None = None) -> list[np.ndarray]:
        data = self.user_samples()
        if data and not symbols:  # the user's own samples, in turn; shapes a check asks for are generated
            return [a.copy() for a in data[(seed - self.seed) % len(data)]]
        sig = Signature.of(self.imported())
        domains = self.input_domains()
        return random_inputs(sig.inputs, sig.symbols, seed=seed, values=self.symbol_values(symbols),
                             domains=[domains.get(s.name) for s in sig.inputs])

    def dim_analysis(self) -> DimAnalysis:
        """Where each symbolic dim makes the graph valid (cuvil.ir.dim_domains), over the declared
        ``[inputs.NAME] dims`` and the extents of the source's example tensors (cuvil.verify.dims)."""
        if self._dims is None:
            from cuvil.verify.dims import dim_analysis

            dims = self.config.get("dims", {})
            self._dims = dim_analysis(self.imported(), dims if isinstance(dims, Mapping) else {},
                                      self.source.input_spec)
        return self._dims

    def dim_domains(self) -> dict[str, DimDomain]:
        """Per input symbol: its smallest valid extent (and why), and the extent samples use."""
        return self.dim_analysis().domains()

    def symbol_values(self, symbols: Mapping[str, int] | None = None) -> dict[str, int]:
        """The value of every input symbol for a sample: with no ``symbols``, typical extents where the
        graph is valid there, else the smallest valid ones; else ``symbols`` held and the others at their
        smallest valid extents (raised where the graph ties them to the held ones). A value at which
        the graph is not valid is kept as asked (a check probing the input guard asks for those)."""
        analysis = self.dim_analysis()
        if not symbols:
            return analysis.sample_env()
        env, _ = analysis.values(symbols)
        return env

    def user_samples(self) -> list[list[np.ndarray]]:
        """The real samples the user gave (``--inputs DIR``, ``[inputs] data``), in input order; [] when none."""
        folder = self.config.get("input_data")
        if not folder:
            return []
        if self._user is None:
            from cuvil.quant.data import CalibrationDataError, npz_samples

            graph = self.imported()
            names = [v.name for v in graph.inputs]
            try:
                found = npz_samples(Path(folder), names)
            except CalibrationDataError as exc:
                raise VerifyError(f"--inputs: {exc}".replace("calibration ", "")) from None
            for i, sample in enumerate(found):
                for v in graph.inputs:
                    a = sample[v.name]
                    if a.dtype != v.type.dtype.np or a.ndim != v.type.rank or any(
                            isinstance(d, int) and d != n for d, n in zip(v.type.shape, a.shape)):
                        raise VerifyError(f"--inputs: sample {i} gives {v.name} as {a.dtype}{list(a.shape)}; the "
                                          f"model takes {v.type}")
            self._user = [[sample[n] for n in names] for sample in found]
        return self._user

    def input_domains(self) -> dict[str, Domain]:
        """What each input of the model is drawn from, the first that applies of: the user's samples
        (their values, for the shapes a check generates), the domain the configuration declares (``[inputs.NAME]``), the integer range of the source's example tensor
        (a PyTorch module's ``input_spec``), the domain its uses in the graph imply
        (cuvil.ir.domains.infer_domains), and the default (:data:`cuvil.ir.domains.DEFAULT`)."""
        if self._domains is None:
            graph = self.imported()
            names = [v.name for v in graph.inputs]
            declared = self.config.get("inputs", {})
            declared = declared if isinstance(declared, Mapping) else {}
            dims = self.config.get("dims", {})
            unknown = sorted((set(declared) | set(dims if isinstance(dims, Mapping) else {})) - set(names))
            if unknown:
                raise VerifyError(f"[inputs.NAME] tables for inputs the model does not have: {', '.join(unknown)} "
                                  f"(its inputs: {', '.join(names)})")
            inferred = infer_domains(graph)
            examples = self._example_int_ranges(names)
            examples += [None] * (len(names) - len(examples))
            data = self.user_samples()
            out: dict[str, Domain] = {}
            for i, (name, ex) in enumerate(zip(names, examples)):
                d = declared.get(name)
                if data:
                    out[name] = _observed([s[i] for s in data])
                elif isinstance(d, Domain):
                    out[name] = d
                elif ex is not None:
                    out[name] = Domain("the example tensor's range", low=ex[0], high=ex[1])
                else:
                    out[name] = inferred.get(name, DEFAULT)
            self._domains = out
        return self._domains

    def _example_int_ranges(self, names: Sequence[str]) -> list[tuple[int, int] | None]:
        """Per input, ``(min, max)`` of its example when the source gave an integer example tensor."""
        spec = self.source.input_spec
        if isinstance(spec, Mapping):
            examples = [spec.get(n) for n in names]
        elif isinstance(spec, (list, tuple)):
            examples = list(spec)[: len(names)]
        else:
            return []
        ranges: list[tuple[int, int] | None] = []
        for ex in examples:
            if ex is None:
                ranges.append(None)
                continue
            try:
                arr = np.asarray(ex.detach().cpu().numpy() if hasattr(ex, "detach") else ex)
            except (TypeError, ValueError, RuntimeError):
                arr = np.asarray(0.0)
            ok = arr.dtype.kind in "iu" and arr.size > 0
            ranges.append((int(arr.min()), int(arr.max())) if ok else None)
        return ranges

    def reference(self, inputs: Sequence[np.ndarray], *, float64: bool = False) -> list[np.ndarray]:
        """Outputs of the reference interpreter; ``float64=True`` computes float32 graphs in float64."""
        if not float64:
            return list(self.compiled("ref")(*inputs))
        from cuvil.verify.oracles import run_in_float64

        return run_in_float64(self.graph, inputs)

    def source_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """Outputs of the framework the model came from, or None when there is none."""
        from cuvil.verify.oracles import run_source

        if self.source.kind == "tensorflow":
            from cuvil.verify.oracles import run_tensorflow

            return run_tensorflow(self.tensorflow_import.function, inputs)
        return run_source(self.source, self.compiled("ref"), inputs)


"""What every check sees: the model, its Cuvil graph, the targets, seeded inputs and oracles.

Compiled models are cached per (target, options), so checks that need the
same build share it. Oracles: the reference interpreter (Cuvil's semantics,
optionally in float64), and the source framework the model came from
(onnxruntime for ONNX files, eager PyTorch for PyTorch modules).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.ir.graph import Graph
from cuvil.runtime.compiled import CompiledModel
from cuvil.runtime.samples import random_inputs
from cuvil.verify.base import VerifyError


@dataclass
class ModelSource:
    """The model under verification, as the user gave it."""

    kind: str  # "onnx" | "torch" | "graph"
    model: Any
    input_spec: Any = None
    dynamic_shapes: Any = None
    label: str = "model"


@dataclass
class VerifyContext:
    source: ModelSource
    targets: list[str]
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    work_dir: Path = field(default_factory=lambda: Path("."))
    cache_dir: str | None = None
    _graph: Graph | None = None
    _builds: dict[tuple[str, tuple[tuple[str, Any], ...]], CompiledModel] = field(default_factory=dict)

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

    def compiled(self, target: str, **options: Any) -> CompiledModel:
        """The model compiled for ``target`` with ``options`` (cached)."""
        import cuvil

        key = (target, tuple(sorted(options.items())))
        if key not in self._builds:
            src = self.source
            kw: dict[str, Any] = dict(options)
            if target != "ref" and self.cache_dir:
                kw.setdefault("cache_dir", self.cache_dir)
            if src.kind == "torch":
                kw.setdefault("input_spec", src.input_spec)
                if src.dynamic_shapes is not None:
                    kw.setdefault("dynamic_shapes", src.dynamic_shapes)
            model = copy.deepcopy(src.model) if src.kind == "graph" else src.model
            self._builds[key] = cuvil.compile(model, target=target, **kw)
        return self._builds[key]

    def inputs(self, seed: int | None = None, symbols: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """Seeded random inputs that satisfy the model's contract (symbols at small valid values)."""
        m = self.compiled("ref")
        return random_inputs(m.input_specs, m.symbols, seed=self.seed if seed is None else seed, values=symbols)

    def reference(self, inputs: Sequence[np.ndarray], *, float64: bool = False) -> list[np.ndarray]:
        """Outputs of the reference interpreter; ``float64=True`` computes float32 graphs in float64."""
        if not float64:
            return list(self.compiled("ref")(*inputs))
        from cuvil.verify.oracles import run_in_float64

        return run_in_float64(self.graph, inputs)

    def source_outputs(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
        """Outputs of the framework the model came from, or None when there is none."""
        from cuvil.verify.oracles import run_source

        return run_source(self.source, self.compiled("ref"), inputs)

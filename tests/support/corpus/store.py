"""Compiling the corpus once per test module: each (model, route, variant) imported once, built once per target.

:class:`CorpusStore` keeps what it compiled (and what failed, so that the same failure is reported
to every test of that case without exporting again), and PyTorch's eager outputs per model and
input shape.  A C target builds from the graph the ``ref`` compile imported (``ref`` runs the graph
as imported, without passes), so a model is exported and imported once for all its targets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import cuvil
from tests.support.corpus.models import MODELS, CorpusModel, Positional, Shape, eager
from tests.support.corpus.routes import onnx_file, torch_dynamic_shapes

Case = tuple[str, str, str]  # model, route, variant


class CorpusStore:
    """Compiled corpus models, their modules and their eager outputs, made on first use."""

    def __init__(self, build_cache: Path) -> None:
        self.build_cache = build_cache
        self._modules: dict[str, Positional] = {}
        self._eager: dict[tuple[str, Shape], list[np.ndarray]] = {}
        self._compiled: dict[tuple[Case, str], cuvil.CompiledModel | BaseException] = {}

    def module(self, name: str) -> Positional:
        if name not in self._modules:
            self._modules[name] = MODELS[name].build()
        return self._modules[name]

    def inputs(self, name: str, shape: Shape) -> list[np.ndarray]:
        return [t.numpy() for t in MODELS[name].sample(shape)]

    def expected(self, name: str, shape: Shape) -> list[np.ndarray]:
        key = (name, shape)
        if key not in self._eager:
            self._eager[key] = eager(self.module(name), MODELS[name].sample(shape))
        return self._eager[key]

    def compiled(self, case: Case, target: str) -> cuvil.CompiledModel:
        key = (case, target)
        if key not in self._compiled:
            try:
                self._compiled[key] = self._compile(case, target)
            except Exception as exc:
                self._compiled[key] = exc
        got = self._compiled[key]
        if isinstance(got, BaseException):
            raise got
        return got

    def _compile(self, case: Case, target: str) -> cuvil.CompiledModel:
        if target != "ref":
            graph = self.compiled(case, "ref").graph
            return cuvil.compile(graph, target=target, cache_dir=str(self.build_cache))
        name, route, variant = case
        model = MODELS[name]
        if route == "torch_export":
            kwargs: dict[str, Any] = {"dynamic_shapes": torch_dynamic_shapes(model)} if variant == "dynamic" else {}
            return cuvil.compile(self.module(name), target="ref", input_spec=list(model.sample(model.example)),
                                 **kwargs)
        return cuvil.compile(str(onnx_file(model, route, variant)), target="ref")


def shapes(model: CorpusModel, variant: str) -> list[Shape]:
    """The input shapes a variant runs at: the export's example, and for a dynamic one the others too."""
    return [model.example, *(model.others if variant == "dynamic" else ())]

"""CompiledModel: the callable that ``cuvil.compile`` returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from cuvil.errors import InputError
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.runtime.guards import bind_inputs


class Executor(Protocol):
    """What a backend provides: run validated inputs, return outputs."""

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]: ...


class TensorSpec:
    """The declared type of one model input or output."""

    def __init__(self, name: str, type: TensorType) -> None:
        self.name = name
        self.type = type

    @property
    def dtype(self) -> str:
        return str(self.type.dtype)

    @property
    def shape(self) -> tuple[Any, ...]:
        return self.type.shape

    def __repr__(self) -> str:
        return f"TensorSpec({self.name!r}, {self.type})"


class CompiledModel:
    """A model compiled for one target. Call it with arrays in graph-input order."""

    def __init__(self, graph: Graph, executor: Executor, target: str) -> None:
        self.graph = graph
        self.target = target
        self._executor = executor
        self.input_specs = [TensorSpec(v.name, v.type) for v in graph.inputs]
        self.output_specs = [TensorSpec(v.name, v.type) for v in graph.outputs]

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.input_specs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.output_specs]

    @property
    def symbols(self) -> dict[str, SymbolInfo]:
        return dict(self.graph.symbols)

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        arrs = [np.asarray(a) for a in arrays]
        env = bind_inputs(self.input_names, [s.type for s in self.input_specs], arrs, self.graph.symbols)
        return self._executor.run(arrs, env)

    def run(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
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

    def __repr__(self) -> str:
        ins = ", ".join(f"{s.name}: {s.type}" for s in self.input_specs)
        return f"CompiledModel(target={self.target!r}, inputs=({ins}))"



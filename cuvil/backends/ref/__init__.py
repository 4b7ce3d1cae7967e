"""The reference target: Cuvil's NumPy interpreter."""

from __future__ import annotations

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.ir.graph import Graph


class RefExecutor:
    """Runs a graph with the reference interpreter."""

    enforces_run_limits = True  # the loop reference reads cuvil.runtime.limits

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return run_graph(self.graph, inputs)


__all__ = ["RefExecutor", "run_graph"]

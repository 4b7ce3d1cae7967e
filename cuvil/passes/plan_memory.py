"""The ``plan-memory`` pass: give every intermediate of the top-level schedule an offset in one arena.

The planning itself (liveness, in-place reuse, placement, symbolic offsets) is the C backend's
(``cuvil/backends/c/memplan.py``, whose docstring states its rules): which kernels may write
over their inputs is a fact of the C kernels.  This pass runs it and records the plan on the
graph (``graph.memory_plan``), where the C code generator reads it; without the pass every
tensor is allocated on its own, so planned and unplanned builds can be compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from cuvil.ir.graph import Graph
from cuvil.passes.base import Pass, PassResult, register_pass


@register_pass
@dataclass(frozen=True)
class PlanMemory(Pass):
    """Plans the memory of the top-level schedule into one arena per call.

    1. A value lives from its defining node to its last reader in the top-level schedule
       (reads inside If/Loop regions count for the node holding them).
    2. Every intermediate whose size the inputs' shapes determine is planned; graph outputs,
       constants, If/Loop results and every value defined inside a region keep their own
       allocations.
    3. With ``in-place`` (the default), an elementwise kernel writes its output over an input of
       the same element type and shape that dies at that node.
    4. Offsets come from a greedy-by-size, best-fit placement; with symbolic dims they are
       expressions of the symbols, exact for every value the inputs give.
    5. ``poison`` fills the arena with 0xFF bytes (a NaN in every float type) before the first
       node and each buffer again when its last value dies, so a read of memory that is stale
       or was never written shows in the outputs.
    6. The graph's nodes are not changed; the plan must be the pipeline's last pass (the code
       generator refuses a plan that no longer fits the graph).
    """

    name: ClassVar[str] = "plan-memory"
    in_place: bool = True
    poison: bool = False

    def run(self, graph: Graph) -> PassResult:
        from cuvil.backends.c.memplan import plan_memory

        before = graph.memory_plan
        graph.memory_plan = plan_memory(graph, in_place=self.in_place, poison=self.poison, planted=self.faults)
        return PassResult(graph, graph.memory_plan != before)

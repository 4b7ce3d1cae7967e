"""The ``ref`` target's entry in the backend table: the reference interpreter runs the graph itself."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.backends.registry import Backend, register_backend
from cuvil.log import stage

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions

_log = logging.getLogger(__name__)


class RefBackend(Backend):
    """The NumPy reference interpreter: the semantic oracle every other target is checked against.

    It runs the graph as imported (no passes), so it runs every op the IR declares, on any machine,
    in one thread; nothing is built, so the build options have no meaning for it."""

    family_label: ClassVar[str] = "ref"
    summary: ClassVar[str] = "runs the reference interpreter"
    builds: ClassVar[bool] = False
    runs_as: ClassVar[str] = "the reference interpreter"
    toolchain: ClassVar[str] = "builds nothing (the reference interpreter runs the graph)"

    def default_pipeline(self, *, enable_fusion: bool = True) -> str:
        return ""  # the oracle runs the graph as imported

    def quantization_pipeline(self, *, enable_fusion: bool = True) -> str:
        # the passes an int8 graph needs before calibration (fold-batchnorm: BatchNorm folded into
        # the convolutions it follows is what gets quantized); the interpreter runs the result
        return "canonicalize,fold-constants,cse,dce,fold-batchnorm"

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        from cuvil.backends.ref import RefExecutor

        with stage(_log, "load", times):
            return RefExecutor(graph)


REF = register_backend(RefBackend("ref"))

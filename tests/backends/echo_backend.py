"""A test backend: the reference interpreter registered under another name, after its own pipeline.

It is the worked example of docs/adding-a-target.md: a target is one :class:`Backend` subclass,
registered by name.  This one builds nothing (it hands the graph to the reference interpreter),
but unlike ``ref`` it runs a pipeline of its own, so the tests can see compile, the pipeline
builder and the backend table work for a target nobody in ``cuvil/`` knows by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.backends.registry import Backend, register_backend, unregister_backend

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions

NAME = "echo-ref"


class EchoRefBackend(Backend):
    """Runs the graph left by a clean-up pipeline in the reference interpreter."""

    family_label: ClassVar[str] = "echo"
    summary: ClassVar[str] = "runs the reference interpreter after the clean-up passes"
    builds: ClassVar[bool] = False

    def __init__(self, name: str = NAME) -> None:
        super().__init__(name)
        self.built: list[CompileOptions] = []  # the options of every build, for the tests to read

    def default_pipeline(self, *, enable_fusion: bool = True) -> str:
        return "canonicalize,fold-constants,cse,dce"

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        from cuvil.backends.ref import RefExecutor

        self.built.append(options)
        return RefExecutor(graph)


@contextmanager
def echo_backend() -> Iterator[EchoRefBackend]:
    """The test backend, registered for the ``with`` block and unregistered after it."""
    backend = register_backend(EchoRefBackend())
    try:
        yield backend
    finally:
        unregister_backend(backend.name)

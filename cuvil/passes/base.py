"""What a pass is: a small named object with typed options that maps a graph to a graph.

A pass never prints, times or verifies itself; the PassManager does that
through instruments. Its docstring states its rules as a numbered list.

    @register_pass
    @dataclass(frozen=True)
    class DeadCodeElimination(Pass):
        '''Removes nodes whose outputs nothing reads.

        1. A node is dead when no graph output and no live node reads any of its outputs.
        2. Nodes with side effects (none in Cuvil's op set today) are kept.
        '''

        name: ClassVar[str] = "dce"

        def run(self, graph: Graph) -> PassResult:
            ...
            return PassResult(graph, changed)

Options are dataclass fields with defaults; in pipeline text they are
written ``fuse{max-ops=16}`` (field ``max_ops``).  ``str(pass)`` is that text,
made by :func:`format_pass`, the one formatter of passes (the pipeline text of
``cuvil.passes.manager`` joins its results): a string value that holds
``,{}=``, quotes or spaces, or would read as another kind, is JSON-quoted, so the
text always parses back to an equal pass.

A pass whose rules hold within one graph at a time (a pattern, a fusion: its
nodes all in one graph) derives from :class:`GraphPass` and implements
``run_on(graph) -> bool``; the base applies it to the top graph and to every
control-flow region (:func:`nested_graphs`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph
from cuvil.ops.fused import FUSED_OPS


class PassError(CuvilError):
    """A pipeline that does not parse, an unknown pass, or a bad option."""


@dataclass
class PassResult:
    graph: Graph
    changed: bool


@dataclass(frozen=True)
class Pass:
    """Base of all passes. Subclasses are frozen dataclasses whose fields are the options."""

    name: ClassVar[str] = ""

    def run(self, graph: Graph) -> PassResult:
        raise NotImplementedError

    def options(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def faults(self) -> frozenset[str]:
        """The planted faults (cuvil/faults.py) of the compile this pass instance runs in: given by
        :meth:`with_faults`, not an option (no part of the pipeline text or of equality)."""
        planted: frozenset[str] = self.__dict__.get("_planted", frozenset())
        return planted

    def with_faults(self, planted: frozenset[str]) -> Pass:
        """This pass for a compile that plants ``planted`` (the pipeline builder,
        ``cuvil.pipeline.build_pipeline``, hands every pass its compile's faults)."""
        if planted == self.faults:
            return self
        p = copy.copy(self)
        object.__setattr__(p, "_planted", frozenset(planted))
        return p

    def __str__(self) -> str:
        return format_pass(self)


@dataclass(frozen=True)
class GraphPass(Pass):
    """A pass applied to each graph on its own: the top graph, then every control-flow region.

    1. ``run_on(g)`` rewrites the one graph ``g`` in place (its nodes, not its regions') and
       says whether it changed anything; ``run`` reports a change when any call did.
    2. The graphs are those of :func:`nested_graphs`, listed before the first call, outermost
       first: a region is rewritten after the graph holding it, and regions the pass itself
       creates (those of the fused ops it builds) are not visited.
    3. The regions of fused ops are never visited: their contents are fixed by the fusion that
       built them.
    """

    def run(self, graph: Graph) -> PassResult:
        changed = False
        for g in nested_graphs(graph):
            changed |= self.run_on(g)
        return PassResult(graph, changed)

    def run_on(self, graph: Graph) -> bool:
        raise NotImplementedError


def nested_graphs(graph: Graph) -> list[Graph]:
    """``graph`` and the regions of its control-flow nodes (not those of fused ops), outermost first."""
    out = [graph]
    for n in graph.nodes:
        if n.op not in FUSED_OPS:
            for _, g in n.regions():
                out.extend(nested_graphs(g))
    return out


# an option value written without quotes: no separator, brace, quote or space
BARE_VALUE = re.compile(r"[^,{}=\s\"]+")


def format_pass(p: Pass) -> str:
    """``name`` or ``name{key=value,...}``: the pass's pipeline text, options at their defaults left out."""
    opts = []
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        if v != f.default:
            opts.append(f"{f.name.replace('_', '-')}={format_value(v)}")
    return f"{p.name}{{{','.join(opts)}}}" if opts else p.name


def format_value(v: object) -> str:
    """An option value as pipeline text that reads back as the same value (cuvil/passes/manager.py)."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        plain = BARE_VALUE.fullmatch(v) is not None and v.lower() not in ("none", "true", "false")
        return v if plain and not _looks_numeric(v) else json.dumps(v)
    return repr(v) if isinstance(v, float) else str(v)


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


P = TypeVar("P", bound=type[Pass])
_PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: P) -> P:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _PASSES and _PASSES[cls.name] is not cls:
        raise ValueError(f"a pass named {cls.name!r} is already registered")
    _PASSES[cls.name] = cls
    return cls


def get_pass(name: str) -> type[Pass]:
    try:
        return _PASSES[name]
    except KeyError:
        known = ", ".join(sorted(_PASSES))
        raise PassError(f"unknown pass {name!r} (known: {known})") from None


def all_passes() -> dict[str, type[Pass]]:
    return dict(_PASSES)



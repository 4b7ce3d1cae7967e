"""The PassManager, pipeline text, and the default pipeline of each target.

A pipeline is data: a list of pass instances that prints to and parses from
text such as ``canonicalize,fold-constants,fuse{max-ops=16},plan-memory``.
Options go in braces as ``key=value`` (dashes in keys stand for the
underscores of the pass's fields); a value is read by the field's type:
``true``/``false`` for bools, numbers, ``none`` for an optional field left
unset, and strings bare or JSON-quoted (quoted when they hold ``,{}=`` or
spaces, or read as another kind).

The PassManager runs a pipeline on a graph, in place, with instruments
around every pass (``cuvil.passes.instruments``), optionally stopping after
the first ``limit`` passes, and leaves a :class:`PassReport`.  After every
pass it checks the graph kept its signature: the same inputs (names and
types), the same output names, and output types that are equal or only more
precise (a dim unknown before may become known).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import types
import typing
from collections.abc import Sequence
from typing import Any

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import is_unknown
from cuvil.ir.types import TensorType
from cuvil.passes.base import BARE_VALUE, Pass, PassError, format_pass, get_pass
from cuvil.passes.instruments import Instrument, PassRecord, PassReport, PipelineError

_log = logging.getLogger(__name__)


def default_pipeline(target: str, *, enable_fusion: bool = True) -> str:
    """The pipeline ``cuvil.compile`` and ``cuvil opt`` run for ``target`` when none is given: the
    one its backend names (``cuvil.backends.registry.Backend.default_pipeline``).

    ``ref`` runs no passes: the reference interpreter runs the graph as imported, so it stays
    the oracle every optimised target (and every pass, through ``numeric-each``) is checked
    against.  The C and wasm32 targets run :func:`standard_pipeline`.  Options beyond fusion
    (precision, quantization) add to it: ``cuvil.pipeline.build_pipeline``."""
    # The backend table sits above the passes; it is read here, at call time, so that the one
    # answer to "which pipeline does this target run" is the backend's.
    from cuvil.backends.registry import get_backend

    return get_backend(target).default_pipeline(enable_fusion=enable_fusion)


# ---- pipeline text ----------------------------------------------------------------------------------------------

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def parse_pipeline(text: str) -> list[Pass]:
    """The passes ``text`` names, each built with its options; a :class:`PassError` says what is wrong."""
    p = _TextParser(text)
    passes: list[Pass] = []
    p.skip_ws()
    if p.at_end():
        return passes
    while True:
        passes.append(p.pass_())
        p.skip_ws()
        if p.at_end():
            return passes
        p.expect(",")


def format_pipeline(passes: Sequence[Pass]) -> str:
    """The pipeline text of ``passes``: each one's ``str`` (:func:`~cuvil.passes.base.format_pass`), options
    at their defaults left out."""
    return ",".join(format_pass(p) for p in passes)


class _TextParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def error(self, msg: str) -> PassError:
        return PassError(f"pipeline {self.text!r}, at character {self.i + 1}: {msg}")

    def at_end(self) -> bool:
        return self.i >= len(self.text)

    def skip_ws(self) -> None:
        while not self.at_end() and self.text[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        self.skip_ws()
        return self.text[self.i] if not self.at_end() else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            found = repr(self.text[self.i]) if not self.at_end() else "the end"
            raise self.error(f"expected {ch!r}, found {found}")
        self.i += 1

    def name(self, what: str) -> str:
        self.skip_ws()
        m = _NAME.match(self.text, self.i)
        if m is None:
            found = repr(self.text[self.i]) if not self.at_end() else "the end"
            raise self.error(f"expected {what}, found {found}")
        self.i = m.end()
        return m.group()

    def value(self) -> tuple[str, bool]:
        """An option value's text, and whether it was quoted."""
        self.skip_ws()
        if self.peek() == '"':
            try:
                s, end = json.JSONDecoder().raw_decode(self.text, self.i)
            except json.JSONDecodeError:
                raise self.error("unterminated or malformed quoted string") from None
            self.i = end
            return str(s), True
        m = BARE_VALUE.match(self.text, self.i)
        if m is None:
            raise self.error("expected an option value")
        self.i = m.end()
        return m.group(), False

    def pass_(self) -> Pass:
        name = self.name("a pass name")
        cls = get_pass(name)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        if self.peek() == "{":
            self.i += 1
            if self.peek() == "}":
                self.i += 1
            else:
                while True:
                    key = self.name("an option name")
                    field = key.replace("-", "_")
                    if field not in fields:
                        known = ", ".join(f.replace("_", "-") for f in fields) or "none"
                        raise PassError(f"pass {name!r} has no option {key!r} (its options: {known})")
                    if field in kwargs:
                        raise PassError(f"pass {name!r}: option {key!r} is given twice")
                    self.expect("=")
                    text, quoted = self.value()
                    kwargs[field] = _convert(name, key, hints[field], text, quoted)
                    if self.peek() == ",":
                        self.i += 1
                        continue
                    self.expect("}")
                    break
        try:
            return cls(**kwargs)
        except (ValueError, TypeError) as exc:
            raise PassError(f"pass {name!r}: {exc}") from None


def _convert(pass_name: str, key: str, hint: Any, text: str, quoted: bool) -> Any:
    """``text`` as a value of type ``hint`` (int, float, bool, str, or one of them or None)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        if not quoted and text.lower() == "none":
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _convert(pass_name, key, rest[0], text, quoted)
    what = f"pass {pass_name!r}: option {key!r}"
    if hint is bool:
        low = text.lower()
        if not quoted and low in ("true", "false", "1", "0"):
            return low in ("true", "1")
        raise PassError(f"{what} takes true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise PassError(f"{what} takes an integer, got {text!r}") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise PassError(f"{what} takes a number, got {text!r}") from None
    if hint is str:
        return text
    raise PassError(f"{what} has type {hint}, which pipeline text cannot give")


# ---- running ----------------------------------------------------------------------------------------------------


class PassManager:
    """Runs a pipeline on a graph, in place, with instruments around every pass.

        pm = PassManager("canonicalize,fold-constants,cse,dce",
                         instruments=[VerifyEach(), NumericEach(seed=0), DumpIR("dumps"), Timing()], limit=3)
        graph = pm.run(graph)
        print(pm.report)          # per pass: changed, seconds, verify ok, relative L2 error per output

    ``limit`` runs only the first ``limit`` passes (the rest are recorded as skipped), so a
    wrong result can be pinned to the pass that caused it by bisecting over it.  A pass
    that raises, or that breaks the graph's signature, stops the run with a
    :class:`PipelineError` whose ``report`` covers the run so far; so does an instrument that
    finds a problem it is told to stop for (invalid IR, an error above a tolerance)."""

    def __init__(self, pipeline: str | Sequence[Pass], instruments: Sequence[Instrument] = (),
                 limit: int | None = None) -> None:
        self.passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
        for p in self.passes:
            if not isinstance(p, Pass):
                raise PassError(f"a pipeline holds Pass objects, got {type(p).__name__}")
        for inst in instruments:
            if not isinstance(inst, Instrument):
                raise PassError(f"an instrument must be an Instrument, got {type(inst).__name__}")
        if limit is not None and limit < 0:
            raise PassError(f"the passes limit must not be negative, got {limit}")
        # Stable: innermost instruments (Timing) go last, so their hooks sit closest to the pass.
        self.instruments = sorted(instruments, key=lambda i: i.innermost)
        self.limit = limit
        self.report: PassReport | None = None

    @property
    def pipeline(self) -> str:
        return format_pipeline(self.passes)

    def __repr__(self) -> str:
        return f"PassManager({self.pipeline!r}, limit={self.limit})"

    def run(self, graph: Graph) -> Graph:
        report = self.report = PassReport(self.pipeline, self.limit)
        signature = _signature(graph)
        try:
            for inst in self.instruments:
                inst.before_pipeline(graph, report)
            for index, p in enumerate(self.passes, 1):
                record = PassRecord(index, p.name, format_pass(p))
                report.records.append(record)
                if self.limit is not None and index > self.limit:
                    record.skipped = True
                    continue
                graph = self._run_one(p, graph, record, signature)
            for inst in self.instruments:
                inst.after_pipeline(graph, report)
        except PipelineError as exc:
            exc.report = report
            raise
        return graph

    def _run_one(self, p: Pass, graph: Graph, record: PassRecord, signature: _Sig) -> Graph:
        for inst in self.instruments:
            inst.before_pass(p, graph, record)
        t0 = time.perf_counter()
        try:
            result = p.run(graph)
        except CuvilError as exc:
            raise PipelineError(f"pass #{record.index} {record.text!r} failed: {exc}") from exc
        except Exception as exc:  # a bug in the pass: name it, keep the traceback
            raise PipelineError(f"pass #{record.index} {record.text!r} failed: {type(exc).__name__}: {exc}") from exc
        took = time.perf_counter() - t0
        graph, record.changed = result.graph, result.changed
        # Every after-hook runs even when something is wrong (a dump of broken IR is what one
        # wants to read); the first problem found is raised once they have.
        problems: list[PipelineError] = []
        change = _signature_change(signature, _signature(graph))
        if change is not None:
            problems.append(PipelineError(f"pass #{record.index} {record.text!r} changed the graph's signature: {change}"))
        for inst in reversed(self.instruments):
            try:
                inst.after_pass(p, graph, record)
            except PipelineError as exc:
                problems.append(exc)
        if problems:
            raise problems[0]
        _log.debug("pass #%d %s: %s in %.4f s", record.index, record.text,
                   "changed" if record.changed else "unchanged", took)
        return graph


_Sig = tuple[list[tuple[str, TensorType]], list[tuple[str, TensorType]], dict[str, Any]]


def _signature(graph: Graph) -> _Sig:
    return ([(v.name, v.type) for v in graph.inputs], [(v.name, v.type) for v in graph.outputs], dict(graph.symbols))


def _signature_change(before: _Sig, after: _Sig) -> str | None:
    ins0, outs0, syms0 = before
    ins1, outs1, syms1 = after
    if ins0 != ins1:
        return f"inputs {_show(ins0)} became {_show(ins1)}"
    if syms0 != syms1:
        return f"symbols {list(syms0.values())} became {list(syms1.values())}"
    if [n for n, _ in outs0] != [n for n, _ in outs1]:
        return f"outputs {_show(outs0)} became {_show(outs1)}"
    for (name, t0), (_, t1) in zip(outs0, outs1):
        if t0 == t1:
            continue
        refines = t0.dtype == t1.dtype and t0.rank == t1.rank and all(
            a == b or is_unknown(a) for a, b in zip(t0.shape, t1.shape))
        if not refines:
            return f"output {name!r} has type {t1}, it had {t0}"
    return None


def _show(items: Sequence[tuple[str, TensorType]]) -> str:
    return "(" + ", ".join(f"{n}: {t}" for n, t in items) + ")"

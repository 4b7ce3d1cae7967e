"""Pass instruments, and the report a pipeline run leaves behind.

An instrument watches a pipeline run through hooks the PassManager calls:
``before_pipeline``, then ``before_pass`` / ``after_pass`` around every pass
(``after_pass`` hooks run in reverse order, so instruments nest), then
``after_pipeline``.  What an instrument finds goes into the pass's
:class:`PassRecord`, so a run's results are data (:class:`PassReport`), not
prints.  Passes never print, time or verify themselves.

- :class:`VerifyEach` (``verify-each``): the IR verifier on the input and after every pass;
- :class:`NumericEach` (``numeric-each``): the reference interpreter on seeded inputs
  after every pass, and the relative L2 error each pass introduced, per output;
- :class:`DumpIR` (``dump-ir DIR``): numbered text dumps ``000-input.cir``, ``003-fuse.cir``;
- :class:`Timing` (``timing``): seconds per pass (innermost, so other instruments' work
  is not counted).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from cuvil.ir.graph import Graph
from cuvil.metrics import relative_l2
from cuvil.passes.base import PassError

if TYPE_CHECKING:
    from cuvil.passes.base import Pass

_log = logging.getLogger(__name__)


@dataclass
class PassRecord:
    """What is known about one pass of a run; fields stay None when no instrument measured them."""

    index: int  # 1-based position in the pipeline
    name: str
    text: str  # the pass with its options, as pipeline text
    skipped: bool = False  # beyond --passes-limit
    changed: bool | None = None
    seconds: float | None = None
    verified: bool | None = None
    # Relative L2 error per output: against the outputs before this pass, and against the input graph's.
    errors: dict[str, float] | None = None
    total_errors: dict[str, float] | None = None
    notes: list[str] = field(default_factory=list)
    dump: str | None = None

    @property
    def max_error(self) -> float | None:
        return max(self.errors.values(), default=0.0) if self.errors is not None else None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("index", "name", "text", "skipped", "changed", "seconds", "verified",
                                              "errors", "total_errors", "notes", "dump")}


@dataclass
class PassReport:
    """A pipeline run: the pipeline, the limit it ran under, and one record per pass."""

    pipeline: str
    limit: int | None = None
    records: list[PassRecord] = field(default_factory=list)
    input_dump: str | None = None
    notes: list[str] = field(default_factory=list)

    def ran(self) -> list[PassRecord]:
        return [r for r in self.records if not r.skipped]

    def first_error_above(self, tolerance: float) -> PassRecord | None:
        """The first pass that introduced a relative L2 error above ``tolerance`` on some output."""
        for r in self.ran():
            if r.max_error is not None and r.max_error > tolerance:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "limit": self.limit, "input_dump": self.input_dump, "notes": self.notes,
                "passes": [r.to_json() for r in self.records]}

    def table(self) -> str:
        """The report as an aligned text table, one row per pass."""
        rows = [("#", "pass", "changed", "seconds", "verify", "max rel L2", "notes")]
        for r in self.records:
            if r.skipped:
                rows.append((str(r.index), r.text, "skipped (limit)", "", "", "", ""))
                continue
            rows.append((
                str(r.index),
                r.text,
                _yes_no(r.changed),
                "" if r.seconds is None else f"{r.seconds:.4f}",
                "" if r.verified is None else ("ok" if r.verified else "FAILED"),
                "" if r.max_error is None else f"{r.max_error:.3g}",
                "; ".join(r.notes),
            ))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _yes_no(v: bool | None) -> str:
    return "" if v is None else ("yes" if v else "no")


class PipelineError(PassError):
    """A pass failed, broke the IR or the graph's signature, or went past a numeric tolerance.

    ``report`` holds the run up to and including the pass that failed."""

    def __init__(self, message: str, report: PassReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class Instrument:
    """Base of instruments: every hook does nothing."""

    name: ClassVar[str] = ""
    innermost: ClassVar[bool] = False  # run its hooks closest to the pass (Timing)

    def before_pipeline(self, graph: Graph, report: PassReport) -> None:
        """Called once, before the first pass."""

    def before_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        """Called right before ``p`` runs on ``graph``."""

    def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        """Called right after ``p`` ran; ``graph`` is the graph it returned."""

    def after_pipeline(self, graph: Graph, report: PassReport) -> None:
        """Called once, after the last pass that ran."""


class VerifyEach(Instrument):
    """The IR verifier on the pipeline's input and after every pass.

    Invalid IR stops the run with a :class:`PipelineError` naming the pass that produced it
    (or saying the input was already invalid)."""

    name = "verify-each"

    def before_pipeline(self, graph: Graph, report: PassReport) -> None:
        from cuvil.ir.verify import verification_errors

        problems = verification_errors(graph)
        if problems:
            raise PipelineError(f"the pipeline's input is invalid IR, before any pass ran: {_listing(problems)}", report)

    def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        from cuvil.ir.verify import verification_errors

        problems = verification_errors(graph)
        record.verified = not problems
        if problems:
            raise PipelineError(f"pass #{record.index} {record.text!r} produced invalid IR: {_listing(problems)}")


def _listing(problems: Sequence[str], limit: int = 10) -> str:
    more = f" ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{len(problems)} problem(s): " + "; ".join(problems[:limit]) + more


class NumericEach(Instrument):
    """Runs the reference interpreter on seeded inputs before the first pass and after every
    pass, and records the relative L2 error (:func:`cuvil.metrics.relative_l2`) each pass introduced on each
    output, and the error accumulated since the input graph.

    Inputs are ``inputs`` when given (in graph-input order), else seeded random arrays from
    ``cuvil.ir.samples.random_inputs`` (symbols take ``dims`` or their smallest extent at
    which the graph is valid: ``cuvil.ir.dim_domains``).  With ``tolerance``, a pass whose error on any output exceeds it stops the run
    with a :class:`PipelineError`.  When the interpreter cannot run the input graph on these
    inputs, every pass is noted as not measured; when it fails only after a pass, that pass
    is charged an infinite error."""

    name = "numeric-each"

    def __init__(self, seed: int = 0, *, inputs: Sequence[np.ndarray] | None = None,
                 dims: Mapping[str, int] | None = None, tolerance: float | None = None) -> None:
        self.seed = seed
        self.inputs = list(inputs) if inputs is not None else None
        self.dims = dict(dims or {})
        self.tolerance = tolerance
        self._feeds: list[np.ndarray] = []
        self._original: list[np.ndarray] | None = None
        self._current: list[np.ndarray] | None = None
        self._why_not = ""

    def before_pipeline(self, graph: Graph, report: PassReport) -> None:
        from cuvil.ir.dim_domains import analyse_dims
        from cuvil.ir.domains import infer_domains
        from cuvil.ir.samples import random_inputs
        from cuvil.ir.spec import TensorSpec

        if self.inputs is not None:
            self._feeds = self.inputs
        else:
            specs = [TensorSpec(v.name, v.type) for v in graph.inputs]
            domains = infer_domains(graph)  # token ids within their tables, masks as masks
            # the other symbols where the graph is valid (every window fits, reshapes divide evenly)
            dims = analyse_dims(graph).values(self.dims)[0]
            self._feeds = random_inputs(specs, graph.symbols, seed=self.seed, values=dims,
                                        domains=[domains.get(s.name) for s in specs])
        self._original = self._current = None
        self._why_not = ""
        try:
            self._original = self._current = self._run(graph)
        except Exception as exc:  # whatever stops the interpreter is reported, not raised
            self._why_not = f"numeric-each: the reference interpreter cannot run the input graph: {type(exc).__name__}: {exc}"
            report.notes.append(self._why_not)

    def _run(self, graph: Graph) -> list[np.ndarray]:
        from cuvil.backends.ref.interpreter import run_graph

        return [np.asarray(a) for a in run_graph(graph, self._feeds)]

    def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        if self._current is None or self._original is None:
            record.notes.append("not measured")
            return
        names = [v.name for v in graph.outputs]
        try:
            outs = self._run(graph)
        except Exception as exc:  # invalid IR fails with a KeyError: verify-each says why
            record.errors = {n: float("inf") for n in names}
            record.notes.append(f"reference interpreter failed after this pass: {type(exc).__name__}: {exc}")
            self._current = None  # later passes have nothing sound to be compared with
            self._check(record)
            return
        record.errors = {n: relative_l2(a, b) for n, b, a in zip(names, self._current, outs)}
        record.total_errors = {n: relative_l2(a, b) for n, b, a in zip(names, self._original, outs)}
        self._current = outs
        self._check(record)

    def _check(self, record: PassRecord) -> None:
        if self.tolerance is None or record.errors is None:
            return
        bad = {n: e for n, e in record.errors.items() if not e <= self.tolerance}
        if bad:
            shown = ", ".join(f"{n}: {e:.3g}" for n, e in bad.items())
            raise PipelineError(f"pass #{record.index} {record.text!r} changed the outputs by more than the "
                                f"tolerance {self.tolerance:g} (relative L2 error {shown})")


_DUMP_NAME = re.compile(r"\d{3}-.+\.cir\Z")


class DumpIR(Instrument):
    """Writes the IR text before the first pass (``000-input.cir``) and after every pass
    (``001-canonicalize.cir``, ...) into ``directory``, created if needed.

    Dumps of an earlier run in that folder (files named like these) are removed first, so the
    folder shows one run.  ``elide=True`` shortens large tensors (readable, not parsable)."""

    name = "dump-ir"

    def __init__(self, directory: str | Path, *, elide: bool = False) -> None:
        self.directory = Path(directory)
        self.elide = elide

    def _write(self, graph: Graph, stem: str) -> str:
        from cuvil.ir.printer import print_graph

        path = self.directory / f"{stem}.cir"
        path.write_text(print_graph(graph, elide=self.elide), encoding="utf-8")
        return str(path)

    def before_pipeline(self, graph: Graph, report: PassReport) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in self.directory.iterdir():
            if old.is_file() and _DUMP_NAME.match(old.name):
                old.unlink()
        report.input_dump = self._write(graph, "000-input")

    def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        record.dump = self._write(graph, f"{record.index:03d}-{p.name}")


class Timing(Instrument):
    """Seconds each pass took (its ``run`` alone: the manager runs this instrument's hooks
    closest to the pass), logged at DEBUG and kept in the record."""

    name = "timing"
    innermost = True

    def __init__(self) -> None:
        self._t0 = 0.0

    def before_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        self._t0 = time.perf_counter()

    def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
        record.seconds = time.perf_counter() - self._t0
        _log.debug("pass #%d %s: %.4f s (%s)", record.index, record.text, record.seconds,
                   "changed" if record.changed else "unchanged")

"""Calibration: running the fp32 graph on the calibration set and observing the tensors to quantize.

How the graph runs (:func:`calibration_runner`):

1. On a native C build of it, by default: a copy of the graph whose outputs are the
   watched tensors (graph inputs are read from the feeds), compiled for ``native``
   with ``dce,plan-memory`` (nothing else changes its nodes; the taps are planned as
   outputs) into the compile's own build cache, so a repeated compile finds it there.
   C builds give bitwise-identical results whatever the thread count.
2. On the reference interpreter, only where no C compiler can run: that is logged
   (INFO, on ``cuvil.quant``) and recorded in the quantization report's ``runner``.
   Float32 native and reference results may differ in the last bits, so scales may
   too; the reference stays the semantic oracle of the quantized graph itself.

When the model's batch dim is a symbol, consecutive feeds whose other dims agree are
concatenated along it into calls of up to :data:`CALIBRATION_BATCH` examples (within
the symbol's declared maximum), as many as keep a call's watched tensors within
:data:`CALL_BYTES` (sized on the first feed, which runs alone).  Small models gain from
fewer calls; ImageNet-size CNNs (over 10 MB of watched tensors per example) run fastest
one example per call, their working set then staying in cache (measured: MobileNetV2
40% slower in calls of 16).  Examples are independent, the observers' statistics
(min, max, integer histogram counts over fixed bins) do not depend on how elements are
grouped, and the C kernels compute each example alike whatever the batch, so the scales
are byte-identical to one example per call (a test checks it).

Observers (``cuvil/quant/observers.py``) accumulate in float64 in feed order:
``minmax`` needs one pass over the data; ``percentile`` and ``entropy`` a second
one, whose histogram bins are fixed by the first pass's ranges.

Before anything runs, every feed is checked against the model's contract (the
input guards' :func:`bind_inputs`) and :func:`check_coverage` refuses a set that
never exercises a range the model declares.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.errors import CuvilError, InputError
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import DimExpr
from cuvil.ops.common import graph_assumptions
from cuvil.quant.data import CalibrationDataError, CalibrationSet, batch_dim
from cuvil.quant.observers import METHODS, CalibrationError, TensorObserver, histogram_kind
from cuvil.runtime.guards import bind_inputs

log = logging.getLogger("cuvil.quant")

CALIBRATION_BATCH = 16  # the most examples per call of the calibration build, where the batch dim is symbolic
CALL_BYTES = 8 << 20  # ... and while a call's watched tensors stay within this many bytes
Feed = tuple[np.ndarray, ...]


class CoverageError(CuvilError):
    """The calibration set never exercises a range of input shapes the model declares."""


def symbol_extents(graph: Graph, calib: CalibrationSet) -> list[dict[str, int]]:
    """The symbol values of each feed (checking the feed against the model's contract)."""
    names = [v.name for v in graph.inputs]
    types = [v.type for v in graph.inputs]
    checks = tuple(graph_assumptions(graph))
    out = []
    for i, feed in enumerate(calib.feeds):
        try:
            out.append(bind_inputs(names, types, list(feed), graph.symbols, checks))
        except InputError as exc:
            raise CalibrationDataError(f"calibration feed {i} does not fit the model: {exc}") from None
    return out


def check_coverage(graph: Graph, calib: CalibrationSet) -> None:
    """Refuse calibration data that never exercises a range of input shapes the model declares.

    Cuvil models declare no ranges of input *values*; what they declare is which dims may
    vary (symbols, with their constraints).  Activation ranges depend on those extents: a
    longer sequence spreads attention differently, a larger image has less of its area in
    the padding, so scales taken at one extent do not hold at others.  The rule: every
    symbol that the model lets vary, other than the batch dim (examples are independent,
    so their number does not change per-element statistics), must take at least two
    different values over the calibration feeds.  Otherwise the error names the symbol,
    the one value seen and the declared range, and says to either calibrate across the
    range or fix the dim to the value calibrated (``dims={name: value}``)."""
    envs = symbol_extents(graph, calib)
    bdim = batch_dim(graph) if calib.batch_axis else None
    batch = next(iter(bdim.symbols())) if isinstance(bdim, DimExpr) else None
    for name, info in sorted(graph.symbols.items()):
        if name == batch or (info.min is not None and info.min == info.max):
            continue
        seen = sorted({env[name] for env in envs if name in env})
        if len(seen) == 1:
            declared = info.describe() or "any size"
            raise CoverageError(
                f"the calibration set never exercises the range of symbolic dim {name!r}: every sample has "
                f"{name}={seen[0]}, but the model declares {name} in {declared}.  Activation ranges depend on it, "
                f"so scales from one extent may not hold at others: calibrate with samples spanning {name}'s range, "
                f"or compile for that one extent with dims={{{name!r}: {seen[0]}}}")


@dataclass(frozen=True)
class RunnerOptions:
    """Where calibration runs the graph: the compile's C compiler, build cache, thread count and
    planted faults (cuvil/faults.py: a calibration build has the bugs its compile plants), and the
    most examples per call (1: one feed per call, as given)."""

    cc: str | None = None
    cache_dir: str | None = None
    num_threads: int | None = None
    batch: int = CALIBRATION_BATCH
    faults: frozenset[str] = frozenset()


@dataclass
class CalibrationRunner:
    """Runs the float32 graph on one feed and returns the watched non-input tensors, in order."""

    kind: str  # "native", "reference" or "none" (only graph inputs are observed)
    run: Callable[[Feed], list[np.ndarray]]
    why: str = ""  # why the reference interpreter runs it (empty for native)
    build_seconds: float = 0.0
    cached: bool | None = None
    calls: int = 0
    feeds: int = 0
    batch: int = 1  # the most examples merged into one call
    seconds: float = 0.0
    watched: tuple[str, ...] = ()  # the names of the tensors ``run`` returns

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runner": self.kind, "feeds": self.feeds, "batch": self.batch, "calls": self.calls,
                               "seconds": self.seconds}
        if self.kind == "native":
            out.update(build_seconds=self.build_seconds, build_cached=self.cached)
        else:
            out["why"] = self.why
        return out


def compiler_unavailable(cc: str | None) -> str | None:
    """None when the C compiler ``cc`` (None: ``cc``) runs here, else why not."""
    from cuvil.backends.c.toolchain import Compiler

    try:
        Compiler.from_string(cc).version  # noqa: B018  (runs ``cc --version``)
    except CuvilError as exc:
        return str(exc)
    return None


def calibration_runner(graph: Graph, watched: Sequence[Value], options: RunnerOptions) -> CalibrationRunner:
    """A runner of ``graph`` returning the values of ``watched`` (non-input values of its top level):
    a native build, or the reference interpreter where no C compiler runs (logged; see the module
    docstring)."""
    why = compiler_unavailable(options.cc)
    if why is not None:
        log.info("calibration runs on the reference interpreter (slow): no C compiler for a native build: %s", why)
        return _reference_runner(graph, watched, f"no C compiler: {why}")
    return _native_runner(graph, watched, options)


def _native_runner(graph: Graph, watched: Sequence[Value], options: RunnerOptions) -> CalibrationRunner:
    import cuvil
    from cuvil.passes.rewrite import copy_graph

    tapped = copy_graph(graph)
    tapped.memory_plan = None
    same = {o: c for n, m in zip(graph.nodes, tapped.nodes) for o, c in zip(n.outputs, m.outputs)}
    tapped.outputs = [same[v] for v in watched]
    t0 = time.perf_counter()
    model = cuvil.compile(tapped, "native", passes="dce,plan-memory", cache_dir=options.cache_dir, cc=options.cc,
                          num_threads=options.num_threads, faults=options.faults)
    seconds = time.perf_counter() - t0
    log.info("calibration runs on a native build of the float32 graph tapped at %d tensors (%s, %.2f s)",
             len(watched), "build cache hit" if model.info.cached else "built", seconds)
    return CalibrationRunner("native", lambda feed: [np.asarray(a) for a in model(*feed)], build_seconds=seconds,
                             cached=model.info.cached, watched=tuple(v.name for v in watched))


def _reference_runner(graph: Graph, watched: Sequence[Value], why: str) -> CalibrationRunner:
    index = {v: i for i, v in enumerate(watched)}

    def run(feed: Feed) -> list[np.ndarray]:
        got: list[np.ndarray | None] = [None] * len(watched)

        def hook(node: Node, outs: list[np.ndarray]) -> None:
            for v, a in zip(node.outputs, outs):
                i = index.get(v)
                if i is not None:
                    got[i] = a

        run_graph(graph, list(feed), on_node=hook)
        missing = [watched[i].name for i, a in enumerate(got) if a is None]
        if missing:
            raise CalibrationError(f"tensor {missing[0]!r} was never computed on the calibration samples "
                                   "(a value only control flow reaches)")
        return [a for a in got if a is not None]

    return CalibrationRunner("reference", run, why=why, watched=tuple(v.name for v in watched))


def confirm_batch_axis(graph: Graph, calib: CalibrationSet, runner: CalibrationRunner) -> CalibrationSet:
    """``calib``, or its samples without a batch axis (each one example, nothing split or merged) when
    axis 0 of the inputs is a symbol along which examples do not run independently: a sequence-first
    model (``[seq, batch, d]``, ``[seq, d]``) has a symbolic axis 0 too, and counting, splitting or
    concatenating its samples along it would calibrate on sequences no input holds.

    The probe: the first feed's rows (or the first two feeds' together) run as one call and as two,
    on ``runner``; along a batch axis every watched tensor of the one call is the two calls' results
    concatenated along axis 0 (or, where it has no batch rows, the same).  One mismatch and axis 0
    is not a batch.  Where no probe fits (one example in all), ``calib`` is kept."""
    if not calib.batch_axis or not isinstance(batch_dim(graph), DimExpr) or runner.kind == "none":
        return calib
    symbol_extents(graph, calib)  # every feed fits the model's contract, or the error says which does not
    probe = _probe_feeds(graph, calib.feeds)
    if probe is None:
        return calib
    whole, parts = probe
    got = runner.run(whole)
    split = [runner.run(p) for p in parts]
    runner.calls += 3
    for v, a, pieces in zip(runner.watched, got, zip(*split)):
        if not _rows_concatenate(a, pieces):
            log.info("calibration: axis 0 of the inputs is not a batch axis (tensor %r of %d rows differs from "
                     "its rows run apart): each sample counts as one example, nothing is split or merged",
                     v, int(whole[0].shape[0]))
            return calib.without_batch_axis()
    return calib


def _probe_feeds(graph: Graph, feeds: Sequence[Feed]) -> tuple[Feed, tuple[Feed, Feed]] | None:
    if not feeds:
        return None
    first = feeds[0]
    n = int(first[0].shape[0])
    if n >= 2:
        return first, (tuple(a[:n // 2] for a in first), tuple(a[n // 2:] for a in first))
    if len(feeds) < 2 or any(a.shape[1:] != b.shape[1:] for a, b in zip(first, feeds[1])):
        return None
    whole = tuple(np.concatenate([a, b]) for a, b in zip(first, feeds[1]))
    try:
        bind_inputs([v.name for v in graph.inputs], [v.type for v in graph.inputs], list(whole), graph.symbols,
                    tuple(graph_assumptions(graph)))
    except InputError:  # the model takes no two examples at once
        return None
    return whole, (first, feeds[1])


def _rows_concatenate(whole: np.ndarray, pieces: Sequence[np.ndarray]) -> bool:
    """Whether ``whole`` is ``pieces`` concatenated along axis 0, or, for a tensor without rows that
    depend on the batch, the same as each of them."""
    if whole.ndim and all(p.ndim == whole.ndim and p.shape[1:] == whole.shape[1:] for p in pieces) and \
            sum(p.shape[0] for p in pieces) == whole.shape[0]:
        return _close(np.concatenate(list(pieces)), whole)
    return all(_close(p, whole) for p in pieces)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal up to float rounding (native builds give the same bits; the reference interpreter's BLAS
    may round a batch differently)."""
    if a.shape != b.shape:
        return False
    if not np.issubdtype(a.dtype, np.floating):
        return bool(np.array_equal(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    scale = float(np.max(np.abs(b64), initial=0.0, where=np.isfinite(b64)))
    return bool(np.allclose(a64, b64, rtol=1e-4, atol=1e-6 * scale, equal_nan=True))


def batched_feeds(graph: Graph, feeds: Sequence[Feed], batch: int, batch_axis: bool = True) -> list[Feed]:
    """``feeds`` with consecutive ones concatenated along the batch dim into calls of at most ``batch``
    examples (and the batch symbol's declared maximum), where that dim is a symbol, the calibration
    set has a batch axis (``batch_axis``, see :func:`confirm_batch_axis`) and the feeds' other dims
    agree.  Feeds larger than that are left as they are."""
    bdim = batch_dim(graph)
    if batch <= 1 or not batch_axis or not isinstance(bdim, DimExpr):
        return list(feeds)
    (sym,) = bdim.symbols()
    info = graph.symbols.get(sym)
    most = batch if info is None or info.max is None else min(batch, info.max)
    names, types = [v.name for v in graph.inputs], [v.type for v in graph.inputs]
    checks = tuple(graph_assumptions(graph))
    out: list[Feed] = []
    group: list[Feed] = []

    def flush() -> None:
        if len(group) == 1:
            out.append(group[0])
        elif group:
            merged = tuple(np.concatenate([f[k] for f in group]) for k in range(len(group[0])))
            try:  # a constraint tying the batch symbol to others: keep the feeds as given
                bind_inputs(names, types, list(merged), graph.symbols, checks)
                out.append(merged)
            except InputError:
                out.extend(group)
        group.clear()

    for feed in feeds:
        n = int(feed[0].shape[0])
        fits = group and sum(int(f[0].shape[0]) for f in group) + n <= most and all(
            a.shape[1:] == b.shape[1:] and a.dtype == b.dtype for a, b in zip(feed, group[0]))
        if not fits:
            flush()
        group.append(feed)
    flush()
    return out


def observe(graph: Graph, tensors: Sequence[Value], calib: CalibrationSet, method: str, symmetric: bool,
            options: RunnerOptions | None = None, runner: CalibrationRunner | None = None
            ) -> tuple[dict[Value, TensorObserver], CalibrationRunner]:
    """Observers for ``tensors`` (values of ``graph``'s top level), filled from the calibration feeds,
    and the runner that ran the graph on them (default: :func:`calibration_runner` with ``options``)."""
    if method not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    options = options or RunnerOptions()
    observers = {v: TensorObserver(v.name) for v in tensors}
    inputs = [(i, observers[v]) for i, v in enumerate(graph.inputs) if v in observers]
    computed = [v for v in tensors if v not in set(graph.inputs)]
    if runner is None:
        runner = (calibration_runner(graph, computed, options) if computed else
                  CalibrationRunner("none", lambda feed: [], why="only graph inputs are observed"))
    t0 = time.perf_counter()
    runner.feeds = len(calib.feeds)
    watched = [observers[v] for v in computed]

    def call(feed: Feed, update: Callable[[TensorObserver, np.ndarray], None]) -> int:
        """Observe one call's tensors; the bytes of its watched results."""
        for i, o in inputs:
            update(o, feed[i])
        if not watched:
            return 0
        runner.calls += 1
        outs = runner.run(feed)
        for o, a in zip(watched, outs):
            update(o, a)
        return sum(a.nbytes for a in outs)

    def observe_range(o: TensorObserver, a: np.ndarray) -> None:
        o.observe_range(a)

    # the first feed runs alone and sizes the batches of the others (module docstring)
    feeds: list[Feed] = list(calib.feeds[:1])
    if feeds:
        tapped = call(feeds[0], observe_range)
        batched = calib.batch_axis and isinstance(batch_dim(graph), DimExpr)
        examples = int(feeds[0][0].shape[0]) if batched else 1
        runner.batch = min(options.batch, max(1, CALL_BYTES * max(examples, 1) // max(tapped, 1))) if batched else 1
    rest = batched_feeds(graph, calib.feeds[1:], runner.batch, calib.batch_axis)
    for feed in rest:
        call(feed, observe_range)
    feeds += rest
    kind = histogram_kind(method, symmetric)
    if kind is not None:
        for o in observers.values():
            o.start_histogram(*kind)
        for feed in feeds:
            call(feed, lambda o, a: o.observe_histogram(a))
    runner.seconds = time.perf_counter() - t0
    for v, o in observers.items():
        if not o.seen:
            raise CalibrationError(f"tensor {v.name!r} was never computed on the calibration samples "
                                   "(an empty tensor, or a value only control flow reaches)")
    return observers, runner

"""Calibration: running the fp32 graph on the calibration set and observing the tensors to quantize.

The graph is run on the reference interpreter (NumPy: ResNet-18 at 224x224 takes
about 60 ms a sample on two cores, so a tapped native build would not pay for its
compile time), with a hook that hands each watched tensor to its observer
(``cuvil/quant/observers.py``).  ``minmax`` needs one pass over the data;
``percentile`` and ``entropy`` a second one, whose histogram bins are fixed by
the first pass's ranges.

Before anything runs, every feed is checked against the model's contract (the
input guards' :func:`bind_inputs`) and :func:`check_coverage` refuses a set that
never exercises a range the model declares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.errors import CuvilError, InputError
from cuvil.ir.assumptions import graph_assumptions
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import DimExpr
from cuvil.quant.data import CalibrationSet, batch_dim
from cuvil.quant.observers import METHODS, CalibrationError, TensorObserver, histogram_kind
from cuvil.runtime.guards import bind_inputs


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
            raise CoverageError(f"calibration feed {i} does not fit the model: {exc}") from None
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
    bdim = batch_dim(graph)
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


def observe(graph: Graph, tensors: Sequence[Value], calib: CalibrationSet, method: str,
            symmetric: bool) -> dict[Value, TensorObserver]:
    """Observers for ``tensors`` (values of ``graph``'s top level), filled from the calibration feeds."""
    if method not in METHODS:
        raise CalibrationError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
    observers = {v: TensorObserver(v.name) for v in tensors}
    _run(graph, observers, calib, lambda o, a: o.observe_range(a))
    kind = histogram_kind(method, symmetric)
    if kind is not None:
        for o in observers.values():
            o.start_histogram(*kind)
        _run(graph, observers, calib, lambda o, a: o.observe_histogram(a))
    for v, o in observers.items():
        if not o.seen:
            raise CalibrationError(f"tensor {v.name!r} was never computed on the calibration samples "
                                   "(an empty tensor, or a value only control flow reaches)")
    return observers


def _run(graph: Graph, observers: dict[Value, TensorObserver], calib: CalibrationSet,
         update: Callable[[TensorObserver, np.ndarray], None]) -> None:
    watched_inputs = [(i, observers[v]) for i, v in enumerate(graph.inputs) if v in observers]

    def hook(node: Node, outs: list[np.ndarray]) -> None:
        for v, a in zip(node.outputs, outs):
            o = observers.get(v)
            if o is not None:
                update(o, a)

    for feed in calib.feeds:
        for i, o in watched_inputs:
            update(o, feed[i])
        run_graph(graph, list(feed), on_node=hook)

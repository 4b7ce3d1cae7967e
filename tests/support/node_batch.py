"""Many ONNX node conformance cases run through one build: each case imported at its own opset, the
Cuvil graphs merged side by side into one (each case's names prefixed), compiled once per target, and each
case's outputs compared with its reference outputs the way :func:`cuvil.conformance.compare` compares them.

A C build takes seconds, so a target's sweep over a few dozen cases costs one build instead of a few dozen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

import cuvil
from cuvil.conformance import CaseResult, Summary, compare, in_core_scope, load_case, model_ops
from cuvil.errors import CuvilError, UnsupportedOpError
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.graph import Graph


def _rename(g: Graph, prefix: str) -> None:
    """Prefix every value and node name of ``g`` (regions included)."""
    for v in g.inputs:
        v.name = prefix + v.name
    for n in g.nodes:
        n.name = prefix + n.name
        for o in n.outputs:
            o.name = prefix + o.name
        for _, region in n.regions():
            _rename(region, prefix)


def merge(graphs: Sequence[Graph]) -> Graph:
    """One graph computing every graph of ``graphs`` side by side (each imported from its own model, at
    its own opset); graph ``i``'s names get the prefix ``c{i}/``, and its inputs and outputs keep their
    order within the whole.  The graphs are taken over, not copied."""
    merged = Graph(name="merged")
    for i, g in enumerate(graphs):
        _rename(g, f"c{i}/")
        merged.inputs += g.inputs
        merged.nodes += g.nodes
        merged.outputs += g.outputs
        merged.symbols.update(g.symbols)
    merged.share_symbols()
    return merged


def _result(name: str, model: onnx.ModelProto, actual: Sequence[np.ndarray] | Exception,
            expected: list[np.ndarray], seconds: float) -> CaseResult:
    if isinstance(actual, UnsupportedOpError):
        status, message = "unsupported", str(actual)
    elif isinstance(actual, Exception):
        status, message = "error", f"{type(actual).__name__}: {actual}"
    else:
        diff = compare([np.asarray(a) for a in actual], expected)
        status, message = ("pass", "") if diff is None else ("fail", diff)
    return CaseResult(name, status, model_ops(model), in_core_scope(name, model), message[:2000], seconds)


def _run(graph: Graph, inputs: Sequence[np.ndarray], target: str,
         cache_dir: str | None) -> list[np.ndarray] | CuvilError:
    try:
        return list(cuvil.compile(graph, target=target, cache_dir=cache_dir)(*inputs))
    except CuvilError as exc:
        return exc


def run_merged(cases: Sequence[str], target: str, cache_dir: str | None = None,
               expected: Mapping[str, list[np.ndarray]] | None = None) -> Summary:
    """Every case of ``cases`` on ``target``, through one build.

    ``expected`` replaces the stored outputs of the cases it names (by case name) as the oracle.  A case
    that does not import is reported on its own; where the merged graph does not compile or run, its
    cases run one at a time, so the result names the culprit."""
    summary = Summary(target)
    cases_in: list[tuple[str, onnx.ModelProto, list[np.ndarray], list[np.ndarray]]] = []
    for c in cases:
        name = os.path.basename(c.rstrip("/"))
        model, inputs, outputs = load_case(c)
        assert isinstance(model, onnx.ModelProto)
        want = (expected or {}).get(name, outputs)
        try:
            load_onnx(model)
        except CuvilError as exc:
            summary.results.append(_result(name, model, exc, want, 0.0))
            continue
        cases_in.append((name, model, inputs, want))
    if not cases_in:
        return summary
    t0 = time.perf_counter()
    outs = _run(merge([load_onnx(m) for _, m, _, _ in cases_in]), [x for _, _, xs, _ in cases_in for x in xs],
                target, cache_dir)
    seconds = (time.perf_counter() - t0) / len(cases_in)
    for name, model, inputs, want in cases_in:
        if isinstance(outs, CuvilError):
            t1 = time.perf_counter()
            got = _run(load_onnx(model), inputs, target, cache_dir)
            summary.results.append(_result(name, model, got, want, time.perf_counter() - t1))
            continue
        n = len(model.graph.output)
        summary.results.append(_result(name, model, outs[:n], want, seconds))
        outs = outs[n:]
    return summary


def failures(summary: Summary) -> list[str]:
    """``name: status: message`` for every case that did not pass."""
    return [f"{r.name}: {r.status}: {r.message}" for r in summary.results if r.status != "pass"]

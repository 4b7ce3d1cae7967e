"""Many single-model checks (ONNX node conformance cases, small models with an oracle's outputs) run through
a few builds: each model imported at its own opset, a few dozen of the Cuvil graphs merged side by side into
one (each model's names prefixed) and compiled for the target, and each model's outputs compared with its
expected outputs the way :func:`cuvil.conformance.compare` compares them.

A C build takes seconds, so a target's sweep over a hundred cases costs a few builds instead of a hundred.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

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


@dataclass
class Case:
    """One single-model check: a model, its inputs and the outputs expected of it."""

    name: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    expected: list[np.ndarray]


def stored_case(case_dir: str) -> Case:
    """A conformance case with its stored inputs and outputs."""
    model, inputs, outputs = load_case(case_dir)
    assert isinstance(model, onnx.ModelProto)
    return Case(os.path.basename(case_dir.rstrip("/")), model, inputs, outputs)


def _result(case: Case, actual: Sequence[np.ndarray] | Exception, seconds: float) -> CaseResult:
    if isinstance(actual, UnsupportedOpError):
        status, message = "unsupported", str(actual)
    elif isinstance(actual, Exception):
        status, message = "error", f"{type(actual).__name__}: {actual}"
    else:
        diff = compare([np.asarray(a) for a in actual], case.expected)
        status, message = ("pass", "") if diff is None else ("fail", diff)
    return CaseResult(case.name, status, model_ops(case.model), in_core_scope(case.name, case.model), message[:2000],
                      seconds)


def _run(graph: Graph, inputs: Sequence[np.ndarray], target: str,
         cache_dir: str | None) -> list[np.ndarray] | CuvilError:
    try:
        return list(cuvil.compile(graph, target=target, cache_dir=cache_dir)(*inputs))
    except CuvilError as exc:
        return exc


# Models per merged build: the generated code is one function, whose compile time grows faster than its
# length (a wasm32 build of 140 conformance cases takes four times as long as six builds of 24).
CHUNK = 24


def run_merged(cases: Sequence[Case], target: str, cache_dir: str | None = None, chunk: int = CHUNK) -> Summary:
    """Every case of ``cases`` on ``target``, ``chunk`` cases to a build.

    A case that does not import is reported on its own; where a merged graph does not compile or run,
    its cases run one at a time, so the result names the culprit."""
    summary = Summary(target)
    imported: list[Case] = []
    for case in cases:
        try:
            load_onnx(case.model)
        except CuvilError as exc:
            summary.results.append(_result(case, exc, 0.0))
            continue
        imported.append(case)
    for start in range(0, len(imported), chunk):
        summary.results += _run_together(imported[start : start + chunk], target, cache_dir)
    return summary


def _run_together(cases: Sequence[Case], target: str, cache_dir: str | None) -> list[CaseResult]:
    t0 = time.perf_counter()
    outs = _run(merge([load_onnx(c.model) for c in cases]), [x for c in cases for x in c.inputs], target, cache_dir)
    seconds = (time.perf_counter() - t0) / len(cases)
    results = []
    for case in cases:
        if isinstance(outs, CuvilError):
            t1 = time.perf_counter()
            got = _run(load_onnx(case.model), case.inputs, target, cache_dir)
            results.append(_result(case, got, time.perf_counter() - t1))
            continue
        n = len(case.model.graph.output)
        results.append(_result(case, outs[:n], seconds))
        outs = outs[n:]
    return results


def failures(summary: Summary) -> list[str]:
    """``name: status: message`` for every case that did not pass."""
    return [f"{r.name}: {r.status}: {r.message}" for r in summary.results if r.status != "pass"]

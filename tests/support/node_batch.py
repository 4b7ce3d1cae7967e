"""Many ONNX node conformance cases run through one build: the cases of one opset merged side by side
into a single model (each case's names prefixed), compiled once per target, each case's outputs compared
with its reference outputs the way :func:`cuvil.conformance.compare` compares them.

A C build takes seconds, so a target's sweep over a few dozen cases costs a few builds instead of a few
dozen.  Where the merged model does not compile, its cases run one by one through
:func:`cuvil.conformance.run_cases`, so the result names the case at fault.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import compose, helper

import cuvil
from cuvil.conformance import CaseResult, Summary, compare, cuvil_runner, in_core_scope, load_case, model_ops, run_cases
from cuvil.errors import CuvilError


def _opset(model: onnx.ModelProto) -> int:
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=1)


def merge(models: Sequence[onnx.ModelProto]) -> onnx.ModelProto:
    """One model computing every model of ``models`` (all of one opset) side by side; case ``i``'s
    names get the prefix ``c{i}_``, and its inputs and outputs keep their order within the whole."""
    parts = [compose.add_prefix(m, f"c{i}_") for i, m in enumerate(models)]
    graph = helper.make_graph(
        [n for p in parts for n in p.graph.node],
        "merged",
        [v for p in parts for v in p.graph.input],
        [v for p in parts for v in p.graph.output],
        [t for p in parts for t in p.graph.initializer],
        value_info=[v for p in parts for v in p.graph.value_info],
    )
    return helper.make_model(graph, opset_imports=list(models[0].opset_import),
                             ir_version=max(m.ir_version for m in models))


def run_merged(cases: Sequence[str], target: str, cache_dir: str | None = None) -> Summary:
    """Every case of ``cases`` on ``target``, one build per opset among them."""
    loaded = {c: load_case(c) for c in cases}
    groups: dict[int, list[str]] = defaultdict(list)
    for c, (model, _, _) in loaded.items():
        assert isinstance(model, onnx.ModelProto)
        groups[_opset(model)].append(c)
    summary = Summary(target)
    for _, group in sorted(groups.items()):
        models = [loaded[c][0] for c in group]
        t0 = time.perf_counter()
        try:
            compiled = cuvil.compile(merge(models), target=target, cache_dir=cache_dir)  # type: ignore[arg-type]
            outs = list(compiled(*[x for c in group for x in loaded[c][1]]))
        except CuvilError:  # some case does not compile or run: find which, one case at a time
            summary.results += run_cases(group, target, cuvil_runner(target, cache_dir=cache_dir)).results
            continue
        seconds = (time.perf_counter() - t0) / len(group)
        for c in group:
            model, _, expected = loaded[c]
            n = len(model.graph.output)  # type: ignore[attr-defined]
            actual, outs = outs[:n], outs[n:]
            diff = compare([np.asarray(a) for a in actual], expected)
            name = os.path.basename(c.rstrip("/"))
            summary.results.append(CaseResult(name, "pass" if diff is None else "fail", model_ops(model),
                                              in_core_scope(name, model), diff or "", seconds))
    return summary


def failures(summary: Summary) -> list[str]:
    """``name: status: message`` for every case that did not pass."""
    return [f"{r.name}: {r.status}: {r.message}" for r in summary.results if r.status != "pass"]

"""ONNX conformance cases run many to a build: the cases' graphs side by side in one model.

A C target pays a compile per model; a few dozen cases of one op would cost a few dozen
builds.  Cases that import the same opsets are merged, a few at a time, into one model (each case's names
prefixed with its own tag), compiled once and run once; each case's outputs are then
compared with its expected ones by the conformance runner's own rules
(``cuvil.conformance.compare``).  When a merged model fails to compile or run, its cases are
run one by one, so each case reports its own error.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import compose

import cuvil
from cuvil.conformance import compare as compare_outputs
from cuvil.conformance import cuvil_runner, load_case, run_cases


@dataclass
class _Case:
    name: str
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    expected: list[np.ndarray]


def _merged(cases: list[_Case]) -> onnx.ModelProto:
    first = cases[0].model
    graph = onnx.GraphProto(name="cases")
    for i, c in enumerate(cases):
        g = compose.add_prefix(c.model, f"c{i}_").graph
        graph.node.extend(g.node)
        graph.input.extend(g.input)
        graph.output.extend(g.output)
        graph.initializer.extend(g.initializer)
        graph.value_info.extend(g.value_info)
    model = onnx.helper.make_model(graph, opset_imports=list(first.opset_import))
    model.ir_version = max(c.model.ir_version for c in cases)
    return model


def _opset_key(model: onnx.ModelProto) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((o.domain or "ai.onnx", int(o.version)) for o in model.opset_import))


def run_batched(dirs: Iterable[str], target: str, cache_dir: str | None = None,
                outputs: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] | None = None,
                per_build: int = 16) -> dict[str, str]:
    """Each case's result: ``"pass"``, or what failed (a mismatch, or the error that stopped it).

    ``outputs``, when given, receives each merged case's (actual, expected) outputs.  At most
    ``per_build`` cases share a model: the generated code is one C function per model, and a much
    larger one compiles disproportionately slower."""
    dirs = list(dirs)
    groups: dict[tuple[tuple[str, int], ...], list[_Case]] = {}
    for d in dirs:
        model, inputs, expected = load_case(d)
        assert isinstance(model, onnx.ModelProto)
        groups.setdefault(_opset_key(model), []).append(_Case(os.path.basename(d), model, inputs, expected))
    results: dict[str, str] = {}
    batches = [group[at : at + per_build] for group in groups.values() for at in range(0, len(group), per_build)]
    for cases in batches:
        try:
            compiled = cuvil.compile(_merged(cases), target=target, cache_dir=cache_dir)
            outs = list(compiled(*[a for c in cases for a in c.inputs]))
        except Exception:  # the cases one by one say which of them fails, and how
            summary = run_cases([d for d in dirs if os.path.basename(d) in {c.name for c in cases}], target,
                                cuvil_runner(target, cache_dir=cache_dir))
            results.update({r.name: r.status if r.status == "pass" else f"{r.status}: {r.message}"
                            for r in summary.results})
            continue
        at = 0
        for c in cases:
            got, at = outs[at:at + len(c.expected)], at + len(c.expected)
            diff = compare_outputs(got, c.expected)
            if outputs is not None:
                outputs[c.name] = (got, c.expected)
            results[c.name] = "pass" if diff is None else f"fail: {diff}"
    return results

"""Judging one candidate, in the process that runs this module: ``python -m cuvil.reduce.worker DIR``.

``DIR`` holds ``model.cir``, ``inputs.npz`` (keyed by input name) and ``job.json`` (target, planted
faults, threshold, build cache); the worker writes ``outcome.json`` and, when the reference ran,
``expected.npz`` (the reference's outputs, keyed by output name).  Where the folder holds
``reference.npz`` (the outputs the original run recorded for a cut), the reference does not run again.
With the ``onnxruntime`` subject the job names the ``source`` ONNX model: the candidate's cut of it
runs in onnxruntime instead of a Cuvil build.  It runs in a fresh process so
that a crash of the compiled code takes only this process down (the oracle reads a death by signal
as a ``crash`` outcome).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.frontends.onnx.cut import OnnxCutError, load_source
from cuvil.ir.graph import Graph
from cuvil.metrics import compare
from cuvil.reduce.signature import Outcome


def load_arrays(path: Path, names: Sequence[str]) -> list[np.ndarray]:
    """The arrays of ``path`` (an .npz) in the order of ``names``."""
    with np.load(path, allow_pickle=False) as z:
        missing = [n for n in names if n not in z.files]
        if missing:
            raise CuvilError(f"{path}: no array for input(s) {', '.join(missing)} (it holds {', '.join(z.files)})")
        return [z[n] for n in names]


def evaluate(graph: Graph, inputs: Sequence[np.ndarray], target: str, faults: Sequence[str], threshold: float,
             cache_dir: str | None = None,
             reference: Sequence[np.ndarray] | None = None,
             source: Any = None) -> tuple[Outcome, list[np.ndarray] | None]:
    """The outcome of compiling ``graph`` for ``target`` and running it on ``inputs``, with the
    reference's outputs (None when the candidate is invalid); ``reference``: those outputs where they
    are known already, so the reference interpreter does not run again; ``source``: run the cut of
    this ONNX model in onnxruntime instead of a Cuvil build."""
    from cuvil.api import compile as cuvil_compile
    from cuvil.backends.ref.interpreter import run_graph
    from cuvil.ir.verify import verification_errors

    errors = verification_errors(graph)
    if errors:
        return Outcome("invalid", message=errors[0]), None
    try:
        want = list(reference) if reference is not None else run_graph(graph, list(inputs))
    except Exception as exc:  # the candidate is beyond what the reference runs: not a failure of the target
        return Outcome("invalid", error=type(exc).__name__, message=str(exc)), None
    try:
        if source is not None:
            got = run_onnxruntime(source, graph, inputs)
        else:
            m = cuvil_compile(graph, target, cache_dir=cache_dir, faults=frozenset(faults))
            got = m(*inputs)
    except OnnxCutError as exc:
        return Outcome("invalid", error=type(exc).__name__, message=str(exc)), None
    except CuvilError as exc:
        return Outcome("refusal", error=type(exc).__name__, message=str(exc).splitlines()[0][:300]), want
    except Exception as exc:
        return Outcome("crash", error=type(exc).__name__, message=str(exc).splitlines()[0][:300] if str(exc) else ""), want
    worst: Outcome = Outcome("pass")
    for v, g, w in zip(graph.outputs, got, want):
        c = compare(np.asarray(g), w)
        if not c.ok:
            kind = "mismatch" if (c.problem or "").startswith("shape") else "nan"
            return Outcome(kind, v.name, message=c.problem or ""), want
        figs = c.figures()
        if figs["rel_l2"] > threshold and figs["rel_l2"] > worst.figures.get("rel_l2", -1.0):
            worst = Outcome("mismatch", v.name, {"rel_l2": figs["rel_l2"], "max_abs": figs["max_abs"]})
    return worst, want


def run_onnxruntime(source: Any, graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``source`` (an ONNX model) cut as ``graph`` is, run by the onnxruntime subject's session."""
    from cuvil.frontends.onnx.cut import serialize_cut
    from cuvil.verify.onnxruntime_subject import run_once

    return run_once(serialize_cut(source, graph), [v.name for v in graph.inputs], inputs,
                    [v.name for v in graph.outputs])


def main(argv: Sequence[str]) -> int:
    from cuvil.ir.parser import parse_graph

    d = Path(argv[0])
    job: dict[str, Any] = json.loads((d / "job.json").read_text())
    graph = parse_graph((d / "model.cir").read_text())
    inputs = load_arrays(d / "inputs.npz", [v.name for v in graph.inputs])
    known = d / "reference.npz"
    reference = load_arrays(known, [v.name for v in graph.outputs]) if known.exists() else None
    source = load_source(job["source"]) if job.get("subject") == "onnxruntime" else None
    outcome, want = evaluate(graph, inputs, job["target"], job.get("faults", []), float(job["threshold"]),
                             job.get("cache_dir"), reference, source)

    if want is not None and job.get("write_expected", False):
        arrays: dict[str, Any] = {v.name: a for v, a in zip(graph.outputs, want)}
        np.savez(d / "expected.npz", **arrays)
    (d / "outcome.json").write_text(json.dumps(outcome.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""One reduction from end to end: load the model and inputs, record the original run, find the
signature, search, and write the repro folder."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph
from cuvil.reduce.candidate import Space, record
from cuvil.reduce.oracle import Job, Oracle
from cuvil.reduce.repro import write_repro
from cuvil.reduce.search import Progress, ReduceResult, reduce_graph
from cuvil.reduce.signature import DEFAULT_THRESHOLD, FailureSignature


def load_graph(model: Any) -> Graph:
    """A Graph, a ``.cir`` file, or any model form ``cuvil.api.import_model`` takes."""
    if isinstance(model, Graph):
        return model
    if isinstance(model, str | Path) and str(model).endswith(".cir"):
        from cuvil.ir.parser import parse_graph

        return parse_graph(Path(model).read_text())
    from cuvil.api import import_model

    return import_model(model)


def model_inputs(graph: Graph, path: str | Path | None, seed: int = 0) -> list[np.ndarray]:
    """The inputs of the original run: ``path`` (an .npz keyed by input name, or arr_0, arr_1... in
    input order), else seeded random ones."""
    if path is None:
        from cuvil.ir.samples import random_inputs
        from cuvil.ir.spec import TensorSpec

        return random_inputs([TensorSpec(v.name, v.type) for v in graph.inputs], graph.symbols, seed=seed)
    from cuvil.quant.data import npz_sample

    sample = npz_sample(Path(path), [v.name for v in graph.inputs], what="--inputs file")
    return [sample[v.name] for v in graph.inputs]


def reduce_model(model: Any, out_dir: str | Path, *, check: str = "outputs", target: str = "native",
                 inputs: str | Path | None = None, faults: Sequence[str] = (), threshold: float = DEFAULT_THRESHOLD,
                 timeout: float = 120.0, cache_dir: str | None = None, progress: Progress | None = None,
                 source: str | None = None, subject: str | None = None) -> ReduceResult:
    """Reduce ``model``'s failure of ``check`` on ``target`` to a small repro written to ``out_dir``;
    ``subject="onnxruntime"``: the failure of an onnxruntime session on ``model`` (an ONNX file)."""
    from cuvil.faults import checked

    onnx_file = str(Path(model).resolve()) if isinstance(model, str | Path) and str(model).endswith(".onnx") else None
    if subject is not None:
        if subject != "onnxruntime":
            raise CuvilError(f"cuvil reduce: unknown subject {subject!r} (known: onnxruntime)")
        if onnx_file is None:
            raise CuvilError(f"cuvil reduce --subject onnxruntime needs an ONNX model file, not {model!r}")
        if faults:
            raise CuvilError("cuvil reduce --subject onnxruntime plants no faults (they are Cuvil's compiler's)")
        target = "onnxruntime"
    graph = load_graph(model)
    feeds = model_inputs(graph, inputs)
    job = Job(target, tuple(sorted(checked(faults))), threshold, timeout, cache_dir, subject, onnx_file)
    try:
        recorded = record(graph, feeds)
    except CuvilError as exc:
        raise CuvilError(f"cuvil reduce: the reference interpreter cannot run the model: {exc}") from None
    space = Space(graph, recorded)
    with tempfile.TemporaryDirectory(prefix="cuvil-reduce-") as work:
        oracle = Oracle(job, Path(work))
        text, feed = space.build(space.cut(space.work, list(graph.outputs)))
        first = oracle.outcome(text, feed)
        signature = FailureSignature.of(check, target, first, threshold)
        if progress is not None:
            progress(f"original: {space.size(space.cut(space.work, list(graph.outputs)))} nodes, "
                     f"{first.describe()}")
        result = reduce_graph(space, oracle, signature, progress=progress)
        out = Path(out_dir)
        write_repro(out, result, signature, job, source or str(model))
    return result

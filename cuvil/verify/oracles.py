"""Running the model outside Cuvil's compiled targets: in float64, and in its source framework."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from cuvil.ir.graph import Graph

if TYPE_CHECKING:
    from cuvil.runtime.compiled import CompiledModel
    from cuvil.verify.context import ModelSource


def run_in_float64(graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The graph's outputs with every float32 tensor (inputs, weights, results) widened to float64.

    Built by re-typing a copy of the graph: f32 constants and inputs become f64 and every
    node is re-inferred, so the reference interpreter computes in float64 throughout."""
    from cuvil.backends.ref.interpreter import run_graph
    from cuvil.verify.widen import widen_graph

    wide = widen_graph(graph)
    args = [a.astype(np.float64) if a.dtype == np.float32 else a for a in inputs]
    return run_graph(wide, args)


def run_source(source: ModelSource, compiled: CompiledModel, inputs: Sequence[np.ndarray]) -> list[np.ndarray] | None:
    if source.kind == "onnx":
        import onnxruntime as ort

        model: Any = source.model
        if hasattr(model, "SerializeToString"):
            data: Any = model.SerializeToString()
        elif isinstance(model, (bytes, bytearray)):
            data = bytes(model)
        else:
            data = str(model)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        opts.log_severity_level = 3  # not its warnings about the exporter's unused initializers
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feed = dict(zip(compiled.input_names, inputs))
        return [np.asarray(o) for o in sess.run(None, {n: feed[n] for n in names})]
    if source.kind == "torch":
        import torch

        with torch.no_grad():
            out = source.model(*[torch.from_numpy(np.ascontiguousarray(a)) for a in inputs])
        outs = out if isinstance(out, (list, tuple)) else [out]
        return [o.detach().numpy() for o in outs]
    return None


def run_tensorflow(function: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of a TensorFlow model's inference function (cuvil.frontends.tensorflow), in its order."""
    return [np.asarray(v.numpy()) for v in function(*inputs)]

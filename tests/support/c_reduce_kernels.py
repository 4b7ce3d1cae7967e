"""Models of reductions, softmax, normalization and linear-algebra kernels for the C tests (inputs as
(name, type, shape) triples), and the comparison of each C target with the reference interpreter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import cuvil

F32, F16, I64, I32 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64, TensorProto.INT32


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[tuple[str, int, list[Any]]],
               outputs: Sequence[str], consts: Mapping[str, Any] | None = None, opset: int = 21) -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), "kernels",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (consts or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def compare(model: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]], cache: Path, *,
            targets: Sequence[str] = ("generic",)) -> None:
    """Each C target gives the reference's outputs (same dtype and shape) and compiles without warnings."""
    ref = cuvil.compile(model, target="ref")
    for target in targets:
        m = cuvil.compile(model, target=target, cache_dir=str(cache))
        assert m.build_info.warnings == ""  # type: ignore[union-attr]
        for feed in feeds:
            want, got = ref.run(feed), m.run(feed)
            for name, w in want.items():
                g = got[name]
                assert g.dtype == w.dtype and g.shape == w.shape, name
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-6,
                                           err_msg=f"{name} on {target}")


def rand(rng: np.random.Generator, shape: Sequence[int], dtype: Any = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)

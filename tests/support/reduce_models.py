"""Reduction-style one-node models (attribute or input axes) checked against onnxruntime: what the op
tests of reductions, linear algebra and normalization share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import cuvil

RNG = np.random.default_rng(0)


def make_model(
    op_type: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str],
    opset: int,
    *,
    consts: dict[str, np.ndarray] | None = None,
    **attrs: object,
) -> onnx.ModelProto:
    """A one-node model: ``inputs`` become graph inputs, ``consts`` initializers ("" skips an input)."""
    consts = consts or {}
    names = [*inputs, *consts]
    order = attrs.pop("input_order", names)
    node = helper.make_node(op_type, list(order), list(outputs), **attrs)  # type: ignore[arg-type]
    g_in = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
        for n, a in inputs.items()
    ]
    g_out = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs]
    inits = [numpy_helper.from_array(a, n) for n, a in consts.items()]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run_cuvil(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    return cuvil.compile(model)(*inputs.values())


def run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray], out_dtypes: Sequence[np.dtype]) -> list[np.ndarray]:
    """Run with onnxruntime, which needs the output element types declared."""
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for vi, dt in zip(typed.graph.output, out_dtypes):
        vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(dt)
    import onnxruntime as ort  # the importing test modules skip without it

    sess = ort.InferenceSession(typed.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def check_against_ort(
    op_type: str,
    inputs: dict[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    opset: int = 18,
    *,
    consts: dict[str, np.ndarray] | None = None,
    rtol: float = 1e-5,
    **attrs: object,
) -> list[np.ndarray]:
    model = make_model(op_type, inputs, outputs, opset, consts=consts, **attrs)
    got = run_cuvil(model, inputs)
    want = run_ort(model, inputs, [g.dtype for g in got])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return got

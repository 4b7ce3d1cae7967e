"""ONNX models for the wasm32 tests: a model from nodes, the elementwise model (a symbolic dim, broadcasting, a
weight, f16 and int32) with its seeded inputs, and the comparison of two runs' outputs (dtype, shape, values)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

wasmtime = pytest.importorskip("wasmtime")
pytest.importorskip("ziglang")


F32, F16, I32 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT32


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def elementwise_model() -> onnx.ModelProto:
    """Add/Mul/Sub/Neg with a symbolic dim, broadcasting, a weight, f16 and int32."""
    vi = helper.make_tensor_value_info
    w = helper.make_tensor("w", F32, [3], [0.5, -2.0, 3.25])
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"]),
        helper.make_node("Mul", ["s", "w"], ["p"]),
        helper.make_node("Neg", ["p"], ["out"]),
        helper.make_node("Mul", ["h", "h"], ["hh"]),
        helper.make_node("Sub", ["i", "j"], ["ij"]),
    ]
    return make_model(nodes,
                  [vi("x", F32, ["n", 3]), vi("y", F32, [1, 3]), vi("h", F16, ["n"]), vi("i", I32, ["n", 1]),
                   vi("j", I32, [4])],
                  [vi("out", F32, ["n", 3]), vi("hh", F16, ["n"]), vi("ij", I32, ["n", 4])], [w])


def elementwise_inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "x": rng.standard_normal((n, 3)).astype(np.float32),
        "y": rng.standard_normal((1, 3)).astype(np.float32),
        "h": rng.standard_normal(n).astype(np.float16),
        "i": rng.integers(-100, 100, (n, 1)).astype(np.int32),
        "j": rng.integers(-100, 100, 4).astype(np.int32),
    }


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        np.testing.assert_allclose(got[name].astype(np.float64), want[name].astype(np.float64), rtol=1e-6, err_msg=name)

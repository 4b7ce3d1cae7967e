"""conv and conv_transpose: reference against onnxruntime, symbolic shape inference, errors."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontends.onnx import load_onnx

ort = pytest.importorskip("onnxruntime")


def _model(op: str, x_shape: list[Any], w: np.ndarray, b: np.ndarray | None, opset: int = 22,
           **attrs: Any) -> onnx.ModelProto:
    inits = [helper.make_tensor("W", TensorProto.FLOAT, w.shape, w.reshape(-1))]
    inputs = ["X", "W"]
    if b is not None:
        inits.append(helper.make_tensor("B", TensorProto.FLOAT, b.shape, b.reshape(-1)))
        inputs.append("B")
    node = helper.make_node(op, inputs, ["Y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_against_ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    (got,) = cuvil.compile(model)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    return got


CONV_CASES = [
    # x_shape, w_shape, attrs
    ([2, 3, 9, 9], [4, 3, 3, 3], {}),
    ([1, 3, 10, 11], [6, 3, 3, 2], {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ([1, 4, 12, 12], [4, 2, 3, 3], {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ([1, 6, 8, 8], [6, 1, 3, 3], {"group": 6, "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ([1, 2, 7, 8], [3, 2, 4, 4], {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ([1, 2, 7, 8], [3, 2, 4, 3], {"auto_pad": "VALID", "strides": [2, 1]}),
    ([2, 3, 17], [5, 3, 4], {"strides": [3], "dilations": [2], "pads": [1, 3]}),
    ([1, 2, 5, 6, 7], [4, 2, 3, 2, 3], {"strides": [1, 2, 2], "pads": [1, 0, 1, 1, 1, 0]}),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), CONV_CASES)
def test_conv_matches_onnxruntime(x_shape: list[int], w_shape: list[int], attrs: dict[str, Any], bias: bool) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    x = rng.standard_normal(x_shape).astype(np.float32)
    _check_against_ort(_model("Conv", x_shape, w, b, **attrs), x)


TRANSPOSE_CASES = [
    ([1, 2, 4, 5], [2, 3, 3, 3], {}),
    ([2, 4, 3, 3], [4, 2, 3, 2], {"strides": [2, 3], "group": 2}),
    ([1, 2, 4, 4], [2, 3, 3, 3], {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}),
    ([1, 2, 4, 4], [2, 3, 3, 3], {"strides": [2, 2], "dilations": [2, 1]}),
    ([1, 2, 4, 5], [2, 3, 3, 3], {"strides": [2, 2], "output_shape": [10, 11]}),
    ([1, 2, 4, 5], [2, 3, 3, 3], {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ([1, 2, 4, 5], [2, 3, 4, 4], {"strides": [3, 2], "auto_pad": "SAME_LOWER"}),
    ([1, 3, 6], [3, 2, 3], {"strides": [2], "pads": [1, 1]}),
    ([1, 2, 3, 3, 3], [2, 2, 2, 3, 2], {"strides": [2, 1, 2]}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), TRANSPOSE_CASES)
def test_conv_transpose_matches_onnxruntime(x_shape: list[int], w_shape: list[int], attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    group = attrs.get("group", 1)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[1] * group).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    _check_against_ort(_model("ConvTranspose", x_shape, w, b, **attrs), x)


def test_conv_transpose_output_shape_larger_than_full_output_zero_fills() -> None:
    # total padding is negative here: the extra rows and columns only receive the bias.
    w = np.ones((1, 1, 2, 2), np.float32)
    b = np.array([0.5], np.float32)
    x = np.ones((1, 1, 2, 2), np.float32)
    (y,) = cuvil.compile(_model("ConvTranspose", [1, 1, 2, 2], w, b, output_shape=[5, 5]))(x)
    full = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) + 0.5
    # total padding -2 per axis: one pixel of zeros before and one after the full 3x3 output.
    want = np.full((5, 5), 0.5, np.float32)
    want[1:4, 1:4] = full
    np.testing.assert_allclose(y[0, 0], want)


def test_conv_float16_and_float64() -> None:
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2, 3, 3, 3))
    x = rng.standard_normal((1, 3, 6, 6))
    want = _check_against_ort(_model("Conv", [1, 3, 6, 6], w.astype(np.float32), None), x.astype(np.float32))
    for np_t, onnx_t in ((np.float16, TensorProto.FLOAT16), (np.float64, TensorProto.DOUBLE)):
        model = _model("Conv", [1, 3, 6, 6], w.astype(np.float32), None)
        model.graph.input[0].type.tensor_type.elem_type = onnx_t
        model.graph.output[0].type.tensor_type.elem_type = onnx_t
        model.graph.initializer[0].CopyFrom(helper.make_tensor("W", onnx_t, w.shape, w.astype(np_t).reshape(-1)))
        (y,) = cuvil.compile(model)(x.astype(np_t))
        assert y.dtype == np_t
        np.testing.assert_allclose(y.astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_symbolic_output_dims() -> None:
    w = np.zeros((8, 3, 3, 3), np.float32)
    same = load_onnx(_model("Conv", ["n", 3, "h", "w"], w, None, auto_pad="SAME_UPPER", strides=[2, 2]))
    t = same.outputs[0].type
    env = {"n": 2, "h": 15, "w": 16}
    assert t.concrete_shape(env) == (2, 8, 8, 8)  # ceil(in / stride)
    explicit = load_onnx(_model("Conv", ["n", 3, "h", "w"], w, None, pads=[1, 1, 1, 1], strides=[2, 2]))
    assert explicit.outputs[0].type.concrete_shape(env) == (2, 8, 8, 8)  # floor((15 + 2 - 3) / 2) + 1
    wt = np.zeros((8, 3, 3, 3), np.float32)
    tr = load_onnx(_model("ConvTranspose", ["n", 8, "h", "w"], wt, None, strides=[2, 2], pads=[1, 1, 1, 1],
                          output_padding=[1, 1]))
    assert tr.outputs[0].type.concrete_shape(env) == (2, 3, 30, 32)  # 2 * (in - 1) + 1 + 3 - 2


def test_symbolic_model_runs_at_several_sizes() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = _model("Conv", ["n", 3, "h", "w"], w, None, auto_pad="SAME_LOWER", strides=[2, 2])
    compiled = cuvil.compile(model)
    for shape in ((1, 3, 7, 9), (2, 3, 8, 5)):
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = compiled(x)
        (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "message"),
    [
        ([1, 4, 5, 5], [2, 3, 3, 3], {}, "channels"),
        ([1, 4, 5, 5], [3, 2, 3, 3], {"group": 2}, "not divisible by group"),
        ([1, 3, 5, 5], [2, 3, 3, 3], {"strides": [1]}, "strides has 1 values"),
        ([1, 3, 5, 5], [2, 3, 3, 3], {"pads": [1, 1, -1, 1]}, "non-negative"),
        ([1, 3, 5, 5], [2, 3, 3, 3], {"auto_pad": "SAME"}, "auto_pad 'SAME'"),
        ([1, 3, 5, 5], [2, 3, 3, 3], {"kernel_shape": [2, 2]}, "does not match"),
        ([3, 5], [2, 3], {}, "rank >= 3"),
    ],
)
def test_conv_errors(x_shape: list[int], w_shape: list[int], attrs: dict[str, Any], message: str) -> None:
    w = np.zeros(w_shape, np.float32)
    with pytest.raises(CuvilError, match=message):
        load_onnx(_model("Conv", x_shape, w, None, **attrs))


def test_conv_rejects_integer_input() -> None:
    model = _model("Conv", [1, 1, 3, 3], np.zeros((1, 1, 1, 1), np.float32), None)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(CuvilError, match="element type i32"):
        load_onnx(model)


@pytest.mark.serial  # it times the machine: run alone, after the parallel tiers
def test_conv_reference_is_vectorised() -> None:
    # ResNet's stem at 224 x 224 must run at NumPy speed (no Python loop over pixels).
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 3, 7, 7)).astype(np.float32)
    model = _model("Conv", [1, 3, 224, 224], w, None, strides=[2, 2], pads=[3, 3, 3, 3])
    x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    compiled = cuvil.compile(model)
    t0 = time.perf_counter()
    (y,) = compiled(x)
    assert y.shape == (1, 64, 112, 112)
    assert time.perf_counter() - t0 < 5.0

"""Pooling ops: references against onnxruntime, MaxPool indices, symbolic shapes, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontends.onnx import load_onnx

ort = pytest.importorskip("onnxruntime")


def _model(op: str, x_shape: list[Any], outputs: int = 1, opset: int = 22, elem: int = TensorProto.FLOAT,
           **attrs: Any) -> onnx.ModelProto:
    names = ["Y", "I"][:outputs]
    node = helper.make_node(op, ["X"], names, **attrs)
    outs = [helper.make_tensor_value_info("Y", elem, None)]
    if outputs > 1:
        outs.append(helper.make_tensor_value_info("I", TensorProto.INT64, None))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem, x_shape)], outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compare(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = cuvil.compile(model)(x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    return list(got)


POOL_CASES = [
    ([1, 2, 7, 7], {"kernel_shape": [3, 3]}),
    ([2, 3, 9, 8], {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ([1, 2, 7, 8], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ([1, 2, 6, 6], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ([1, 1, 8, 8], {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [1, 2]}),
    ([1, 2, 7, 6], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ([1, 2, 7, 6], {"kernel_shape": [4, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ([1, 2, 7, 6], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ([1, 3, 11], {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),
    ([1, 1, 5, 6, 7], {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
]


@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES)
def test_max_pool_with_indices_matches_onnxruntime(x_shape: list[int], attrs: dict[str, Any]) -> None:
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    _compare(_model("MaxPool", x_shape, outputs=2, **attrs), x)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize(("x_shape", "attrs"), POOL_CASES)
def test_average_pool_matches_onnxruntime(x_shape: list[int], attrs: dict[str, Any], count_include_pad: int) -> None:
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    _compare(_model("AveragePool", x_shape, count_include_pad=count_include_pad, **attrs), x)


def test_max_pool_indices_column_major() -> None:
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 4)).astype(np.float32)
    (y, idx) = _compare(_model("MaxPool", [2, 3, 5, 4], outputs=2, kernel_shape=[2, 2], storage_order=1), x)
    n, c, h, w = np.unravel_index(idx, (2, 3, 4, 5))  # column major in the plane: index = h + w * H
    np.testing.assert_array_equal(x[n, c, w, h], y)


def test_max_pool_padding_never_wins_against_negative_infinity() -> None:
    x = np.full((1, 1, 2, 2), -np.inf, np.float32)
    (y, idx) = cuvil.compile(_model("MaxPool", [1, 1, 2, 2], outputs=2, kernel_shape=[2, 2], pads=[1, 1, 0, 0]))(x)
    assert np.all(y == -np.inf)
    assert np.all((idx >= 0) & (idx < 4))


def test_max_pool_integer_input() -> None:
    x = np.random.default_rng(3).integers(0, 255, (1, 2, 6, 6)).astype(np.uint8)
    _compare(_model("MaxPool", [1, 2, 6, 6], elem=TensorProto.UINT8, kernel_shape=[3, 3], pads=[1, 1, 1, 1]), x)


def test_old_opsets_import() -> None:
    x = np.random.default_rng(4).standard_normal((1, 2, 6, 6)).astype(np.float32)
    _compare(_model("MaxPool", [1, 2, 6, 6], opset=7, kernel_shape=[2, 2], strides=[2, 2]), x)
    _compare(_model("AveragePool", [1, 2, 6, 6], opset=7, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                    count_include_pad=1), x)
    _compare(_model("MaxPool", [1, 2, 6, 6], outputs=2, opset=8, kernel_shape=[2, 2], storage_order=1), x)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [[2, 3, 5], [1, 2, 4, 5], [1, 2, 3, 4, 2]])
def test_global_pools(op: str, shape: list[int]) -> None:
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    (y,) = _compare(_model(op, shape), x)
    assert y.shape == (*shape[:2], *([1] * (len(shape) - 2)))


def test_symbolic_shapes() -> None:
    env = {"n": 2, "h": 9, "w": 10}
    g = load_onnx(_model("MaxPool", ["n", 3, "h", "w"], outputs=2, kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1))
    assert [v.type.concrete_shape(env) for v in g.outputs] == [(2, 3, 5, 6), (2, 3, 5, 6)]
    g = load_onnx(_model("AveragePool", ["n", 3, "h", "w"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"))
    assert g.outputs[0].type.concrete_shape(env) == (2, 3, 5, 5)
    g = load_onnx(_model("GlobalAveragePool", ["n", 3, "h", "w"]))
    assert g.outputs[0].type.shape[2:] == (1, 1)


def test_ceil_mode_rule_that_needs_the_size_gives_unknown_dim() -> None:
    # stride 3 > kernel 2: whether the last window starts past the input depends on h.
    g = load_onnx(_model("MaxPool", [1, 1, "h", 4], kernel_shape=[2, 2], strides=[3, 3], ceil_mode=1))
    shape = g.outputs[0].type.shape
    assert str(shape[2]) == "?" and shape[3] == 2


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ({"kernel_shape": [3]}, "kernel_shape"),
        ({"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, "smaller than the kernel"),
        ({"kernel_shape": [2, 2], "strides": [0, 1]}, "strides must be >= 1"),
        ({"kernel_shape": [9, 2]}, "does not fit"),
        ({"kernel_shape": [2, 2], "storage_order": 2}, "storage_order"),
    ],
)
def test_max_pool_errors(attrs: dict[str, Any], message: str) -> None:
    with pytest.raises(CuvilError, match=message):
        load_onnx(_model("MaxPool", [1, 1, 4, 4], **attrs))


def test_average_pool_rejects_integers() -> None:
    with pytest.raises(CuvilError, match="element type"):
        load_onnx(_model("AveragePool", [1, 1, 4, 4], elem=TensorProto.INT32, kernel_shape=[2, 2]))


@pytest.mark.parametrize(("op", "outputs", "attrs"), [
    ("MaxPool", 1, {"kernel_shape": [2, 2]}),
    ("MaxPool", 2, {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("AveragePool", 1, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
])
@pytest.mark.parametrize("target", ["ref", "native"])
def test_an_empty_batch_gives_empty_outputs(op: str, outputs: int, attrs: dict[str, Any], target: str) -> None:
    m = cuvil.compile(_model(op, ["batch", 2, 4, 4], outputs=outputs, **attrs), target=target)
    got = m(np.zeros((0, 2, 4, 4), np.float32))
    full = m(np.ones((1, 2, 4, 4), np.float32))
    assert [g.shape for g in got] == [(0, *f.shape[1:]) for f in full]

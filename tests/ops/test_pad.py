"""pad: modes, negative pads, axes, run-time pads, the Pad-1/2/11 forms; depth/space rearrangements."""

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


def _model(node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], inits: list[onnx.TensorProto], opset: int,
           elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _pad_model(shape: list[Any], pads: list[int], mode: str, value: float | None = None,
               axes: list[int] | None = None, opset: int = 19) -> onnx.ModelProto:
    inits = [helper.make_tensor("pads", TensorProto.INT64, [len(pads)], pads)]
    names = ["X", "pads", "", ""]
    if value is not None:
        inits.append(helper.make_tensor("value", TensorProto.FLOAT, [], [value]))
        names[2] = "value"
    if axes is not None:
        inits.append(helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes))
        names[3] = "axes"
    while not names[-1]:
        names.pop()
    node = helper.make_node("Pad", names, ["Y"], mode=mode)
    return _model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)], inits, opset)


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(sess.run(None, feeds))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize(
    ("pads", "axes"),
    [([1, 2, 0, 1, 2, 3], None), ([0, 0, 2, 0, 0, 1], None), ([1, 2, 2, 1], [1, -1]), ([2, 1], [-2])],
)
def test_pad_matches_numpy(mode: str, pads: list[int], axes: list[int] | None) -> None:
    x = np.arange(2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    value = 7.5 if mode == "constant" else None
    (y,) = cuvil.compile(_pad_model([2, 4, 5], pads, mode, value, axes))(x)
    axes_n = list(range(3)) if axes is None else [a % 3 for a in axes]
    widths = [(0, 0)] * 3
    for i, a in enumerate(axes_n):
        widths[a] = (pads[i], pads[len(axes_n) + i])
    kwargs: dict[str, Any] = {"constant_values": 7.5} if mode == "constant" else {}
    np.testing.assert_array_equal(y, np.pad(x, widths, mode=mode, **kwargs))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_negative_pads_crop_like_onnxruntime(mode: str) -> None:
    x = np.random.default_rng(0).standard_normal((3, 6)).astype(np.float32)
    model = _pad_model([3, 6], [-1, 2, 1, -2], mode, opset=18)
    (want,) = _run_ort(model, {"X": x})
    (got,) = cuvil.compile(model)(x)
    np.testing.assert_array_equal(got, want)
    assert got.shape == (3, 6)


def test_run_time_pads_give_unknown_dims_and_run() -> None:
    node = helper.make_node("Pad", ["X", "pads"], ["Y"], mode="edge")
    model = _model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 4]),
                          helper.make_tensor_value_info("pads", TensorProto.INT64, [4])], [], 19)
    g = load_onnx(model)
    assert all(str(d) == "?" for d in g.outputs[0].type.shape)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    pads = np.array([1, 0, 0, 2], np.int64)
    (y,) = cuvil.compile(model)(x, pads)
    np.testing.assert_array_equal(y, np.pad(x, [(1, 0), (0, 2)], mode="edge"))


def test_symbolic_dims_with_constant_pads() -> None:
    g = load_onnx(_pad_model(["n", "h"], [0, 1, 0, 2], "constant"))
    assert g.outputs[0].type.concrete_shape({"n": 2, "h": 5}) == (2, 8)


@pytest.mark.parametrize("opset", [1, 2, 11, 13])
def test_old_pad_forms(opset: int) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])]
    if opset < 11:
        name = "paddings" if opset == 1 else "pads"
        node = helper.make_node("Pad", ["X"], ["Y"], mode="constant", value=-1.0, **{name: [0, 1, 1, 0]})
        model = _model(node, inputs, [], opset)
    else:
        node = helper.make_node("Pad", ["X", "pads", "value"], ["Y"], mode="constant")
        inits = [helper.make_tensor("pads", TensorProto.INT64, [4], [0, 1, 1, 0]),
                 helper.make_tensor("value", TensorProto.FLOAT, [], [-1.0])]
        model = _model(node, inputs, inits, opset)
    (y,) = cuvil.compile(model)(x)
    np.testing.assert_array_equal(y, np.pad(x, [(0, 1), (1, 0)], constant_values=-1.0))


def test_integer_data_keeps_its_type() -> None:
    node = helper.make_node("Pad", ["X"], ["Y"], mode="constant", pads=[1, 1], value=3.0)
    model = _model(node, [helper.make_tensor_value_info("X", TensorProto.INT32, [2])], [], 2, TensorProto.INT32)
    (y,) = cuvil.compile(model)(np.array([5, 6], np.int32))
    assert y.dtype == np.int32 and y.tolist() == [3, 5, 6, 3]


@pytest.mark.parametrize(
    ("pads", "mode", "message"),
    [
        ([0, 4, 0, 0], "reflect", "reflect padding of axis 1 by 4 exceeds"),
        ([0, -4, 0, -3], "constant", "crop more than"),
        ([1, 1], "constant", "pads has 2 values, expected 4"),
        ([0, 1, 0, 1], "mirror", "mode 'mirror'"),
    ],
)
def test_pad_errors(pads: list[int], mode: str, message: str) -> None:
    with pytest.raises(CuvilError, match=message):
        load_onnx(_pad_model([2, 4], pads, mode))


# depth_to_space / space_to_depth ----------------------------------------------------------------


def _space_model(op: str, shape: list[Any], opset: int = 13, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, ["X"], ["Y"], **attrs)
    return _model(node, [helper.make_tensor_value_info("X", TensorProto.FLOAT, shape)], [], opset)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_matches_onnxruntime(mode: str) -> None:
    x = np.random.default_rng(1).standard_normal((2, 12, 3, 4)).astype(np.float32)
    model = _space_model("DepthToSpace", [2, 12, 3, 4], blocksize=2, mode=mode)
    (want,) = _run_ort(model, {"X": x})
    (got,) = cuvil.compile(model)(x)
    np.testing.assert_array_equal(got, want)


def test_space_to_depth_matches_onnxruntime_and_inverts_depth_to_space() -> None:
    x = np.random.default_rng(2).standard_normal((1, 3, 6, 4)).astype(np.float32)
    model = _space_model("SpaceToDepth", [1, 3, 6, 4], blocksize=2)
    (want,) = _run_ort(model, {"X": x})
    (y,) = cuvil.compile(model)(x)
    np.testing.assert_array_equal(y, want)
    for mode in ("DCR", "CRD"):  # SpaceToDepth-28 with a mode is the inverse of DepthToSpace in that mode
        (s2d,) = cuvil.compile(_space_model("SpaceToDepth", [1, 3, 6, 4], opset=28, blocksize=2, mode=mode))(x)
        (back,) = cuvil.compile(_space_model("DepthToSpace", [1, 12, 3, 2], blocksize=2, mode=mode))(s2d)
        np.testing.assert_array_equal(back, x)


def test_space_ops_symbolic_and_errors() -> None:
    g = load_onnx(_space_model("DepthToSpace", ["n", 8, "h", "w"], blocksize=2))
    assert g.outputs[0].type.concrete_shape({"n": 1, "h": 3, "w": 5}) == (1, 2, 6, 10)
    with pytest.raises(CuvilError, match="not divisible by blocksize"):
        load_onnx(_space_model("SpaceToDepth", [1, 1, 5, 4], blocksize=2))
    with pytest.raises(CuvilError, match="rank 4"):
        load_onnx(_space_model("DepthToSpace", [1, 4, 4], blocksize=2))

"""resize: every mode against onnxruntime (or ONNX's reference where onnxruntime is known to
differ), the Resize-10/11/13 forms, integer data, symbolic shapes and errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.errors import CuvilError
from cuvil.frontends.onnx import load_onnx

ort = pytest.importorskip("onnxruntime")


def _model(x_shape: list[Any], *, scales: list[float] | None = None, sizes: list[int] | None = None,
           roi: list[float] | None = None, opset: int = 19, elem: int = TensorProto.FLOAT,
           empty_placeholders: bool = False, **attrs: Any) -> onnx.ModelProto:
    inits, names = [], ["X", "", "", ""]
    if roi is not None or empty_placeholders:
        inits.append(helper.make_tensor("roi", TensorProto.FLOAT, [len(roi or [])], roi or []))
        names[1] = "roi"
    if scales is not None or empty_placeholders:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [len(scales or [])], scales or []))
        names[2] = "scales"
    if sizes is not None:
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [len(sizes)], sizes))
        names[3] = "sizes"
    if opset < 11:
        names = ["X", "scales"]
    while not names[-1]:
        names.pop()
    node = helper.make_node("Resize", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem, x_shape)],
                              [helper.make_tensor_value_info("Y", elem, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]  # type: ignore[no-any-return]


def _check(model: onnx.ModelProto, x: np.ndarray, oracle: str = "ort", tol: float = 1e-5) -> np.ndarray:
    want = _ort(model, x) if oracle == "ort" else ReferenceEvaluator(model).run(None, {"X": x})[0]
    (got,) = cuvil.compile(model)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    return got


X = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
SCALES = [[1, 1, 2.0, 1.5], [1, 1, 0.6, 0.5], [1, 1, 1.25, 0.65]]


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric", "pytorch_half_pixel", "half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_scales_match_onnxruntime(mode: str, coord: str, scales: list[float]) -> None:
    _check(_model([1, 2, 5, 7], scales=scales, mode=mode, coordinate_transformation_mode=coord), X)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("sizes", [[1, 2, 9, 4], [1, 2, 3, 13]])
def test_nearest_modes_match_onnxruntime(nearest_mode: str, sizes: list[int]) -> None:
    _check(_model([1, 2, 5, 7], sizes=sizes, mode="nearest", nearest_mode=nearest_mode), X)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 2, 3, 4], [1, 2, 9, 11]])
def test_align_corners_matches_onnx_reference(mode: str, sizes: list[int]) -> None:
    # onnxruntime's align_corners differs from the ONNX test data; ONNX's reference matches it.
    _check(_model([1, 2, 5, 7], sizes=sizes, mode=mode, coordinate_transformation_mode="align_corners"), X, "onnx")


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [[1, 2, 3, 4], [1, 2, 2, 3]])
def test_antialias_matches_onnx_reference(mode: str, sizes: list[int]) -> None:
    _check(_model([1, 2, 5, 7], sizes=sizes, mode=mode, antialias=1), X, "onnx")


def test_cubic_exclude_outside_and_coefficient() -> None:
    _check(_model([1, 2, 5, 7], scales=[1, 1, 1.6, 0.8], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1), X)


@pytest.mark.parametrize("extrapolation", [0.0, 10.0])
def test_tf_crop_and_resize_with_axes(extrapolation: float) -> None:
    model = _model([1, 2, 5, 7], sizes=[4, 6], roi=[0.2, -0.1, 0.9, 1.2], axes=[2, 3], mode="linear",
                   coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=extrapolation)
    y = _check(model, X, "onnx")
    assert np.any(y == extrapolation)  # the roi reaches outside the input along the width


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_keep_aspect_ratio(policy: str) -> None:
    model = _model([1, 2, 5, 7], sizes=[8, 8], axes=[2, 3], mode="nearest", keep_aspect_ratio_policy=policy)
    y = _check(model, X)
    assert y.shape == ((1, 2, 6, 8) if policy == "not_larger" else (1, 2, 8, 11))
    assert load_onnx(model).outputs[0].type.shape == y.shape  # known at compile time from constant sizes


def test_uint8_rounds_and_saturates() -> None:
    x = np.array([[[[0, 255, 0], [255, 0, 255]]]], np.uint8)
    _check(_model([1, 1, 2, 3], scales=[1, 1, 2.0, 2.0], mode="cubic", elem=TensorProto.UINT8), x, "onnx", tol=0)
    # Rounding is half to even, as in ONNX's reference (onnxruntime truncates 127.5 to 127).
    y = _check(_model([1, 1, 2, 3], scales=[1, 1, 1.5, 2.5], mode="linear", elem=TensorProto.UINT8), x, "onnx", tol=0)
    assert 128 in y


def test_output_size_is_computed_in_double_precision() -> None:
    # floor(5 * float32(1.4)) = floor(6.99999988) = 6, as ONNX's shape inference and reference say
    # (onnxruntime multiplies in float32 and gets 7).
    model = _model([1, 2, 5, 7], scales=[1, 1, 1.4, 1], mode="linear")
    onnx_shape = onnx.shape_inference.infer_shapes(model).graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in onnx_shape.dim] == [1, 2, 6, 7]
    assert load_onnx(model).outputs[0].type.shape == (1, 2, 6, 7)
    _check(model, X, "onnx")


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 3.0, 1.7], [1, 1, 0.6, 0.4], [1, 1, 2.0, 0.6]])
def test_resize_10_matches_onnxruntime(mode: str, scales: list[float]) -> None:
    _check(_model([1, 2, 5, 7], scales=scales, opset=10, mode=mode), X)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("coord", ["half_pixel", "tf_half_pixel_for_nn", "align_corners"])
def test_resize_11_13_with_placeholders(opset: int, coord: str) -> None:
    model = _model([1, 2, 5, 7], sizes=[1, 2, 8, 4], opset=opset, empty_placeholders=True, mode="nearest",
                   coordinate_transformation_mode=coord)
    _check(model, X)
    model = _model([1, 2, 5, 7], scales=[1, 1, 1.5, 2.0], roi=[], opset=opset, mode="linear")
    _check(model, X)


def test_symbolic_and_run_time_shapes() -> None:
    g = load_onnx(_model(["n", 3, "h", "w"], scales=[1, 1, 2.0, 3.0]))
    assert g.outputs[0].type.concrete_shape({"n": 2, "h": 4, "w": 5}) == (2, 3, 8, 15)
    g = load_onnx(_model(["n", 3, "h", "w"], scales=[1, 1, 0.5, 0.5]))
    assert g.outputs[0].type.shape[:2] == (sym_n := g.outputs[0].type.shape[0], 3) and str(sym_n) == "n"
    assert [str(d) for d in g.outputs[0].type.shape[2:]] == ["?", "?"]  # floor(h * 0.5) is not kept symbolic
    node = helper.make_node("Resize", ["X", "", "", "sizes"], ["Y"], axes=[2, 3])
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3, 4, 4]),
                      helper.make_tensor_value_info("sizes", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 19)])
    shape = load_onnx(model).outputs[0].type.shape
    assert str(shape[0]) == "n" and shape[1] == 3 and [str(d) for d in shape[2:]] == ["?", "?"]
    x = np.ones((2, 3, 4, 4), np.float32)
    (y,) = cuvil.compile(model)(x, np.array([6, 2], np.int64))
    assert y.shape == (2, 3, 6, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scales": [1, 1, 2, 2], "sizes": [1, 2, 10, 14]}, "exactly one of scales and sizes"),
        ({}, "exactly one of scales and sizes"),
        ({"scales": [1, 2, 2]}, "scales must be 1-D with 4 values"),
        ({"scales": [1, 1, 2, 2], "mode": "bilinear"}, "mode 'bilinear'"),
        ({"scales": [1, 1, 2, 2], "coordinate_transformation_mode": "tf_crop_and_resize"}, "needs roi"),
        ({"scales": [1, 1, 2, 2], "antialias": 1}, "antialias applies"),
        ({"scales": [1, 1, -2, 2]}, "positive"),
    ],
)
def test_resize_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(CuvilError, match=message):
        load_onnx(_model([1, 2, 5, 7], **kwargs))


def test_resize_10_nearest_with_run_time_scales_is_unsupported() -> None:
    node = helper.make_node("Resize", ["X", "scales"], ["Y"], mode="nearest")
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 2, 2]),
                      helper.make_tensor_value_info("scales", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 10)])
    with pytest.raises(CuvilError, match="run-time scales"):
        load_onnx(model)

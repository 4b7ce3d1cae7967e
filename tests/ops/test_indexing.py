"""gather, gather_elements, gather_nd, scatter_elements, scatter_nd, one_hot and non_zero: values
against onnxruntime, out-of-range indices as clear errors, inference (symbolic and unknown dims)."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import CuvilError, ShapeError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, sym
from cuvil.ir.types import TensorType
from tests.support.single_node import check_ort, f32, i64, infer, one_node, run_cuvil

B, N = sym("b"), sym("n")


def out_of_range(op_type: str, inputs: dict[str, np.ndarray], **attrs: object) -> None:
    with pytest.raises(CuvilError, match=r"index -?\d+ is out of range for axis \d of size \d"):
        run_cuvil(one_node(op_type, inputs, **attrs), inputs)  # type: ignore[arg-type]


# gather ----------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_matches_ort(axis: int) -> None:
    check_ort("Gather", {"x": f32(3, 4, 5), "i": np.array([[0, -1], [2, 1]], np.int64)}, axis=axis)
    check_ort("Gather", {"x": f32(3, 4, 5), "i": np.array(-2, np.int32)}, axis=axis)


def test_gather_inference_and_errors() -> None:
    (t,) = infer("gather", [TensorType(DType.f32, (B, 7, 5)), TensorType(DType.i64, (N, 2))], axis=1)
    assert t.shape == (B, N, 2, 5)
    with pytest.raises(ShapeError, match="element type f32"):
        infer("gather", [TensorType(DType.f32, (3,)), TensorType(DType.f32, (2,))])
    out_of_range("Gather", {"x": f32(3, 4), "i": i64(0, 3)})
    out_of_range("Gather", {"x": f32(3, 4), "i": i64(-5)}, axis=1)


# gather_elements / scatter_elements ----------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements_matches_ort(axis: int) -> None:
    idx = np.array([[0, -1, 1], [2, 0, -3]], np.int64)
    check_ort("GatherElements", {"x": f32(3, 3), "i": idx}, axis=axis)
    check_ort("GatherElements", {"x": f32(3, 4), "i": np.array([[1, 0]], np.int64)}, axis=axis)


def test_gather_elements_errors() -> None:
    with pytest.raises(ShapeError, match="must have the rank of data"):
        infer("gather_elements", [TensorType(DType.f32, (3, 3)), TensorType(DType.i64, (3,))])
    with pytest.raises(ShapeError, match="exceeds the data dim"):
        infer("gather_elements", [TensorType(DType.f32, (3, 3)), TensorType(DType.i64, (2, 4))])
    out_of_range("GatherElements", {"x": f32(3, 3), "i": np.array([[3]], np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_matches_ort(reduction: str, axis: int) -> None:
    # duplicates only where a reduction defines their combination
    idx = np.array([[1, 0, 2], [0, 2, 1]] if reduction == "none" else [[1, 1, -1], [0, 2, 1]], np.int64)
    check_ort("ScatterElements", {"x": f32(3, 3), "i": idx, "u": f32(2, 3)}, axis=axis, reduction=reduction)


def test_scatter_elements_old_opsets_and_errors() -> None:
    x, idx, u = f32(3, 3), np.array([[1, 0, 2]], np.int64), f32(1, 3)
    check_ort("ScatterElements", {"x": x, "i": idx, "u": u}, opset=11)
    got = run_cuvil(one_node("Scatter", {"x": x, "i": idx, "u": u}, opset=9), {"x": x, "i": idx, "u": u})[0]
    want = x.copy()
    want[[1, 0, 2], [0, 1, 2]] = u[0]
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ShapeError, match="reduction 'sum' is not one of"):
        infer("scatter_elements", [TensorType(DType.f32, (3,)), TensorType(DType.i64, (1,)), TensorType(DType.f32, (1,))],
              reduction="sum")
    with pytest.raises(ShapeError, match="must have the shape of indices"):
        infer("scatter_elements", [TensorType(DType.f32, (3,)), TensorType(DType.i64, (2,)), TensorType(DType.f32, (1,))])
    out_of_range("ScatterElements", {"x": x, "i": np.array([[3, 0, 0]], np.int64), "u": u})


# gather_nd / scatter_nd ------------------------------------------------------------


@pytest.mark.parametrize(
    ("x_shape", "idx", "batch_dims"),
    [
        ((2, 2), [[0, 0], [1, 1]], 0),
        ((2, 2), [[1], [0]], 0),
        ((2, 2, 2), [[[0, 1]], [[1, 0]]], 0),
        ((2, 2, 2), [[1], [0]], 1),
        ((2, 3, 4), [[[1, -1], [0, 2]], [[2, 0], [-3, 1]]], 1),
        ((2, 3, 4), [[[0], [2], [1]], [[1], [-1], [3]]], 2),
    ],
)
def test_gather_nd_matches_ort(x_shape: tuple[int, ...], idx: list[object], batch_dims: int) -> None:
    check_ort("GatherND", {"x": f32(*x_shape), "i": np.array(idx, np.int64)}, batch_dims=batch_dims)


def test_gather_nd_inference_and_errors() -> None:
    (t,) = infer("gather_nd", [TensorType(DType.f32, (B, 5, 6, 7)), TensorType(DType.i64, (B, N, 2))], batch_dims=1)
    assert t.shape == (B, N, 7)
    with pytest.raises(ShapeError, match="must be known at compile time"):
        infer("gather_nd", [TensorType(DType.f32, (3, 4)), TensorType(DType.i64, (2, N))])
    with pytest.raises(ShapeError, match=r"must be in \[1, 1\]"):
        infer("gather_nd", [TensorType(DType.f32, (3, 4)), TensorType(DType.i64, (3, 2))], batch_dims=1)
    with pytest.raises(ShapeError, match="batch dim 0 differs"):
        infer("gather_nd", [TensorType(DType.f32, (3, 4)), TensorType(DType.i64, (2, 1))], batch_dims=1)
    out_of_range("GatherND", {"x": f32(2, 3), "i": np.array([[1, 3]], np.int64)})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_matches_ort(reduction: str) -> None:
    x = f32(4, 3, 2)
    idx = np.array([[0], [2]] if reduction == "none" else [[0], [-4], [2]], np.int64)  # -4 is 0 again
    check_ort("ScatterND", {"x": x, "i": idx, "u": f32(len(idx), 3, 2)}, reduction=reduction)
    idx2 = np.array([[0, 1], [3, -1]], np.int64)
    check_ort("ScatterND", {"x": x, "i": idx2, "u": f32(2, 2)}, reduction=reduction)


def test_scatter_nd_errors() -> None:
    with pytest.raises(ShapeError, match=r"updates f32\[2\] must have shape \[2, 2\]"):
        infer("scatter_nd", [TensorType(DType.f32, (4, 2)), TensorType(DType.i64, (2, 1)), TensorType(DType.f32, (2,))])
    out_of_range("ScatterND", {"x": f32(4, 2), "i": np.array([[4]], np.int64), "u": f32(1, 2)})


# one_hot ---------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_one_hot_matches_ort(axis: int) -> None:
    idx = np.array([[0, 3, -1], [5, -6, 2]], np.int64)  # 5 and -6 are out of range for depth 5: all off
    check_ort("OneHot", {"i": idx}, consts={"d": np.array(5, np.int64), "v": np.array([2, 7], np.int64)}, axis=axis)
    check_ort("OneHot", {"i": idx.astype(np.float32)}, consts={"d": np.array([4.0], np.float32),
                                                              "v": np.array([0.0, 1.0], np.float32)}, axis=axis)


def test_one_hot_opset9_negative_indices_are_off() -> None:
    ins = {"i": np.array([1, -1, 2], np.int32)}
    consts = {"d": np.array(3, np.int64), "v": np.array([0, 1], np.int64)}
    got = run_cuvil(one_node("OneHot", ins, consts=consts, opset=9), ins)[0]
    np.testing.assert_array_equal(got, [[0, 1, 0], [0, 0, 0], [0, 0, 1]])
    got = run_cuvil(one_node("OneHot", ins, consts=consts, opset=11), ins)[0]
    np.testing.assert_array_equal(got, [[0, 1, 0], [0, 0, 1], [0, 0, 1]])


def test_one_hot_inference() -> None:
    (t,) = infer("one_hot", [TensorType(DType.i64, (B, 3)), np.array(10, np.int64), TensorType(DType.f16, (2,))], axis=1)
    assert t == TensorType(DType.f16, (B, 10, 3))
    (t,) = infer("one_hot", [TensorType(DType.i64, (B,)), TensorType(DType.i64, ()), TensorType(DType.f32, (2,))])
    assert t.shape == (B, UNKNOWN)
    with pytest.raises(ShapeError, match="off_value, on_value"):
        infer("one_hot", [TensorType(DType.i64, (3,)), np.array(4, np.int64), TensorType(DType.f32, (3,))])
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        infer("one_hot", [TensorType(DType.i64, (3,)), np.array(4, np.int64), TensorType(DType.f32, (2,))], axis=3)


# non_zero --------------------------------------------------------------------


def test_non_zero_matches_ort() -> None:
    x = np.array([[1, 0, 3], [0, 0, 2]], np.int32)
    got = check_ort("NonZero", {"x": x})
    assert got[0].dtype == np.int64 and got[0].shape == (2, 3)
    check_ort("NonZero", {"x": np.zeros((2, 2), np.bool_)})
    (t,) = infer("non_zero", [TensorType(DType.f32, (B, 4, 5))])
    assert t == TensorType(DType.i64, (3, UNKNOWN))

"""Reductions, arg_max/arg_min, cumsum, top_k and the softmax family, checked against onnxruntime
and hand-computed values, across the opset forms the importer upgrades."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import CuvilError, ShapeError, UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, sym
from cuvil.ir.types import TensorType
from tests.support.reduce_models import RNG, check_against_ort, run_cuvil
from tests.support.single_node import one_node

ort = pytest.importorskip("onnxruntime")


REDUCE_OPS = [
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceSumSquare",
    "ReduceLogSum",
    "ReduceLogSumExp",
]


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [None, [1], [0, -1]])
def test_reduce_attribute_axes_opset11(op_type: str, keepdims: int, axes: list[int] | None) -> None:
    x = RNG.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
    attrs: dict[str, object] = {"keepdims": keepdims}
    if axes is not None:
        attrs["axes"] = axes
    check_against_ort(op_type, {"x": x}, opset=11, **attrs)


@pytest.mark.parametrize("op_type", REDUCE_OPS)
@pytest.mark.parametrize("runtime_axes", [False, True])
def test_reduce_axes_input_opset18(op_type: str, runtime_axes: bool) -> None:
    x = RNG.uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
    axes = np.array([-1, 0], dtype=np.int64)
    inputs, consts = ({"x": x, "axes": axes}, None) if runtime_axes else ({"x": x}, {"axes": axes})
    for keepdims in (0, 1):
        check_against_ort(op_type, inputs, consts=consts, opset=18, keepdims=keepdims)


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceL2", "ReduceLogSumExp", "ReduceMax"])
def test_reduce_noop_with_empty_axes(op_type: str) -> None:
    x = RNG.uniform(0.5, 2.0, (2, 3)).astype(np.float32)
    opset = 13 if op_type == "ReduceSum" else 18
    got = check_against_ort(op_type, {"x": x}, opset=opset, noop_with_empty_axes=1)
    assert got[0].shape == (2, 3)
    got = check_against_ort(op_type, {"x": x}, opset=opset, keepdims=0)
    assert got[0].shape == ()


def test_reduce_integer_and_bool_inputs() -> None:
    xi = RNG.integers(-50, 50, (3, 4)).astype(np.int32)
    for op_type in ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceMean"):
        check_against_ort(op_type, {"x": xi}, consts={"axes": np.array([1], np.int64)}, opset=18)
    xb = np.array([[True, False], [True, True]])
    model = one_node("ReduceMin", {"x": xb}, ["y"], 20, consts={"axes": np.array([1], np.int64)})
    np.testing.assert_array_equal(run_cuvil(model, {"x": xb})[0], [[False], [True]])


@pytest.mark.parametrize(
    ("op_type", "dtype", "expected"),
    [
        ("ReduceSum", np.float32, 0.0),
        ("ReduceProd", np.float32, 1.0),
        ("ReduceMax", np.float32, -np.inf),
        ("ReduceMin", np.float32, np.inf),
        ("ReduceMin", np.int32, np.iinfo(np.int32).max),
        ("ReduceMax", np.int64, np.iinfo(np.int64).min),
        ("ReduceL2", np.float32, 0.0),
        ("ReduceLogSumExp", np.float32, -np.inf),
        ("ReduceLogSum", np.float32, -np.inf),
    ],
)
def test_reduce_empty_set_identity(op_type: str, dtype: type, expected: float) -> None:
    x = np.zeros((2, 0, 4), dtype=dtype)
    opset = 13 if op_type == "ReduceSum" else 18
    model = one_node(op_type, {"x": x}, ["y"], opset, consts={"axes": np.array([1], np.int64)})
    (y,) = run_cuvil(model, {"x": x})
    assert y.shape == (2, 1, 4) and y.dtype == dtype
    np.testing.assert_array_equal(y, np.full((2, 1, 4), expected, dtype))


def test_reduce_log_sum_exp_is_stable() -> None:
    x = np.array([[1000.0, 1000.0], [-np.inf, -np.inf]], dtype=np.float32)
    model = one_node("ReduceLogSumExp", {"x": x}, ["y"], 18, consts={"axes": np.array([1], np.int64)}, keepdims=0)
    (y,) = run_cuvil(model, {"x": x})
    np.testing.assert_allclose(y, [1000.0 + np.log(2.0), -np.inf])


def test_reduce_half_accumulates_in_float32() -> None:
    x = np.full((4096,), 1.0, dtype=np.float16)
    model = one_node("ReduceSum", {"x": x}, ["y"], 13, keepdims=0)
    (y,) = run_cuvil(model, {"x": x})
    assert y.dtype == np.float16 and float(y) == 4096.0  # float16 accumulation would stall at 2048


def test_reduce_shape_inference_symbolic_and_runtime_axes() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("n"), 3, 1)))
    axes = b.constant(np.array([1], np.int64))
    assert b.add1("reduce_sum", [x, axes], {"keepdims": 0}).type.shape == (sym("n"), 1)
    dyn = b.input("axes", TensorType(DType.i64, (1,)))
    assert b.add1("reduce_max", [x, dyn], {"keepdims": 1}).type.shape == (UNKNOWN, UNKNOWN, 1)
    assert b.add1("reduce_max", [x, dyn], {"keepdims": 0}).type.rank == 2
    empty = b.input("axes0", TensorType(DType.i64, (0,)))
    assert b.add1("reduce_sum", [x, empty], {"keepdims": 0, "noop_with_empty_axes": 1}).type.shape == x.type.shape
    assert b.add1("reduce_sum", [x, empty], {"keepdims": 0}).type.shape == ()
    dyn_n = b.input("axes_n", TensorType(DType.i64, (sym("k"),)))
    with pytest.raises(ShapeError, match="output rank is unknown"):
        b.add1("reduce_mean", [x, dyn_n], {"keepdims": 0})
    with pytest.raises(ShapeError, match="repeated axis"):
        b.add1("reduce_sum", [x, b.constant(np.array([1, -2], np.int64))])
    with pytest.raises(ShapeError, match="out of range"):
        b.add1("reduce_sum", [x, b.constant(np.array([3], np.int64))])
    s = b.input("s", TensorType(DType.bool, (2,)))
    with pytest.raises(ShapeError, match="element type bool"):
        b.add1("reduce_sum", [s])


# arg_max / arg_min / cumsum / top_k ----------------------------------------------------


@pytest.mark.parametrize("op_type", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("select_last_index", [0, 1])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_ops(op_type: str, select_last_index: int, keepdims: int) -> None:
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    check_against_ort(op_type, {"x": x}, opset=13, axis=-2, keepdims=keepdims, select_last_index=select_last_index)


def test_arg_max_old_opset_and_errors() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_against_ort("ArgMax", {"x": x}, opset=11)
    with pytest.raises(UnsupportedOpError, match="select_last_index"):
        run_cuvil(one_node("ArgMax", {"x": x}, ["y"], 11, select_last_index=1), {"x": x})
    with pytest.raises(CuvilError, match="axis 2 is out of range"):
        run_cuvil(one_node("ArgMax", {"x": x}, ["y"], 13, axis=2), {"x": x})


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_cumsum(exclusive: int, reverse: int, dtype: type) -> None:
    x = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    axis = np.array(-1, dtype=np.int32)
    check_against_ort("CumSum", {"x": x, "axis": axis}, opset=14, exclusive=exclusive, reverse=reverse)


def test_cumsum_hand_computed() -> None:
    x = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    for ex, rev, want in [(1, 0, [0, 1, 3, 6]), (0, 1, [10, 9, 7, 4]), (1, 1, [9, 7, 4, 0])]:
        axis = {"axis": np.array(0, np.int64)}
        model = one_node("CumSum", {"x": x}, ["y"], 14, consts=axis, exclusive=ex, reverse=rev)
        np.testing.assert_array_equal(run_cuvil(model, {"x": x})[0], np.array(want, np.float32))


@pytest.mark.parametrize("largest", [0, 1])
def test_top_k_ties_by_lower_index(largest: int) -> None:
    x = np.array([[3, 1, 3, 2, 1, 3]], dtype=np.float32)
    model = one_node("TopK", {"x": x}, ["v", "i"], 11, consts={"k": np.array([4], np.int64)}, largest=largest)
    v, i = run_cuvil(model, {"x": x})
    if largest:
        np.testing.assert_array_equal(i, [[0, 2, 5, 3]])
        np.testing.assert_array_equal(v, [[3, 3, 3, 2]])
    else:
        np.testing.assert_array_equal(i, [[1, 4, 3, 0]])
    assert i.dtype == np.int64


def test_top_k_opsets() -> None:
    x = RNG.standard_normal((3, 5, 4)).astype(np.float32)
    check_against_ort("TopK", {"x": x}, ["v", "i"], opset=1, k=2, axis=1)
    check_against_ort("TopK", {"x": x}, ["v", "i"], opset=10, consts={"k": np.array([3], np.int64)}, axis=-1)
    xu = RNG.integers(0, 100, (4, 6)).astype(np.int64)
    check_against_ort("TopK", {"x": xu}, ["v", "i"], opset=11, consts={"k": np.array([2], np.int64)}, largest=0)


def test_top_k_shape_inference_and_errors() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("n"), 8)))
    k = b.input("k", TensorType(DType.i64, (1,)))
    v, i = b.add("top_k", [x, k], num_outputs=2)
    assert v.type.shape == (sym("n"), UNKNOWN) and i.type.dtype is DType.i64
    with pytest.raises(ShapeError, match="K=9 exceeds the size 8"):
        b.add("top_k", [x, b.constant(np.array([9], np.int64))], num_outputs=2)


# softmax family ----------------------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_softmax_family(op_type: str, opset: int, axis: int | None) -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    attrs = {} if axis is None else {"axis": axis}
    check_against_ort(op_type, {"x": x}, opset=opset, **attrs)


def test_softmax_old_opset_coerces_to_2d() -> None:
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = run_cuvil(one_node("Softmax", {"x": x}, ["y"], 11, axis=1), {"x": x})
    flat = x.reshape(2, 12)
    want = np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, want.reshape(x.shape), rtol=1e-6)
    np.testing.assert_allclose(y.sum(axis=(1, 2)), [1.0, 1.0], rtol=1e-6)


def test_hardmax_marks_first_maximum() -> None:
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]], np.float32)
    (y,) = run_cuvil(one_node("Hardmax", {"x": x}, ["y"], 13), {"x": x})
    np.testing.assert_array_equal(y, [[0, 1, 0], [1, 0, 0]])


def test_softmax_rejects_integers() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.i32, (2, 3)))
    with pytest.raises(ShapeError, match="element type i32"):
        b.add1("softmax", [x])

"""reshape, flatten, squeeze, unsqueeze, transpose, expand, shape and size: values against onnxruntime
(or hand-computed NumPy for opsets it lacks), symbolic shape inference, and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.errors import CuvilError, ShapeError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, Dim, sym
from cuvil.ir.types import SymbolInfo, TensorType
from tests.support.single_node import check_ort, f32, i64, infer, one_node, run_cuvil

ort = pytest.importorskip("onnxruntime")

B, H, W = sym("b"), sym("h"), sym("w")


def shape_of(*dims: Dim) -> tuple[Dim, ...]:
    return tuple(dims)


# reshape -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_shape", "target", "allowzero"),
    [
        ((2, 3, 4), (4, 6), 0),
        ((2, 3, 4), (0, -1), 0),
        ((2, 3, 4), (-1,), 0),
        ((2, 3, 4), (2, 0, 2, -1), 0),
        ((0, 3), (3, 0), 1),
        ((1,), (), 0),
    ],
)
def test_reshape_matches_ort(in_shape: tuple[int, ...], target: tuple[int, ...], allowzero: int) -> None:
    x = f32(*in_shape)
    check_ort("Reshape", {"x": x}, consts={"s": np.array(target, np.int64)}, allowzero=allowzero)


def test_reshape_opset1_shape_attribute() -> None:
    x = f32(2, 3, 4)
    model = one_node("Reshape", {"x": x}, opset=1, shape=[4, -1])
    np.testing.assert_array_equal(run_cuvil(model, {"x": x})[0], x.reshape(4, 6))


def test_reshape_symbolic_minus_one_is_a_symbolic_quotient() -> None:
    (t,) = infer("reshape", [TensorType(DType.f32, (B, 3, H, W)), i64(0, -1)])
    assert t.shape == (B, 3 * H * W)
    (t,) = infer("reshape", [TensorType(DType.f32, (B, 3, H, W)), i64(0, 3, -1)])
    assert t.shape == (B, 3, H * W)


def test_reshape_runtime_shape_keeps_the_rank() -> None:
    (t,) = infer("reshape", [TensorType(DType.f32, (2, 3)), TensorType(DType.i64, (3,))])
    assert t.shape == (UNKNOWN, UNKNOWN, UNKNOWN)
    with pytest.raises(ShapeError, match="rank is unknown"):
        infer("reshape", [TensorType(DType.f32, (2, 3)), TensorType(DType.i64, (sym("n"),))])


@pytest.mark.parametrize(
    ("target", "message"),
    [((-1, -1), "more than one -1"), ((5, -1), "cannot reshape 6"), ((4, 2), "cannot reshape 6"), ((-2, 3), "negative")],
)
def test_reshape_errors(target: tuple[int, ...], message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        infer("reshape", [TensorType(DType.f32, (2, 3)), np.array(target, np.int64)])


def test_reshape_reference_checks_the_element_count() -> None:
    x = f32(2, 3)
    model = one_node("Reshape", {"x": x, "s": i64(5, 1)})
    with pytest.raises(CuvilError, match="cannot reshape 6"):
        run_cuvil(model, {"x": x, "s": i64(5, 1)})


def test_shape_chain_folds_to_a_static_reshape() -> None:
    """Shape -> Slice -> Concat -> Reshape on a static input gives a static output (import-time folding)."""
    x = f32(2, 3, 4)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["head"]),
        helper.make_node("Concat", ["head", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [numpy_helper.from_array(i64(0), "zero"), numpy_helper.from_array(i64(1), "one"),
             numpy_helper.from_array(i64(-1), "minus1")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    graph = cuvil.api.import_model(model)
    assert graph.outputs[0].type.shape == (2, 12)
    np.testing.assert_array_equal(run_cuvil(model, {"x": x})[0], x.reshape(2, 12))


# flatten -------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-3, -1, 0, 1, 2, 3])
def test_flatten_matches_ort(axis: int) -> None:
    check_ort("Flatten", {"x": f32(2, 3, 4)}, axis=axis)


def test_flatten_symbolic() -> None:
    (t,) = infer("flatten", [TensorType(DType.f32, (B, 3, H, W))], axis=2)
    assert t.shape == (3 * B, H * W)
    (t,) = infer("flatten", [TensorType(DType.f32, (B, 3))], axis=0)
    assert t.shape == (1, 3 * B)
    with pytest.raises(ShapeError, match="axis 3 is out of range"):
        infer("flatten", [TensorType(DType.f32, (B, 3))], axis=3)


# squeeze / unsqueeze ---------------------------------------------------------


def test_squeeze_both_opset_forms() -> None:
    x = f32(1, 3, 1, 2)
    check_ort("Squeeze", {"x": x}, consts={"axes": i64(0, -2)}, opset=13)
    check_ort("Squeeze", {"x": x}, opset=11, axes=[2])
    check_ort("Squeeze", {"x": x}, opset=13)


def test_unsqueeze_both_opset_forms() -> None:
    x = f32(3, 2)
    check_ort("Unsqueeze", {"x": x}, consts={"axes": i64(-1, 0)}, opset=13)
    check_ort("Unsqueeze", {"x": x}, opset=11, axes=[1, 3])
    got = check_ort("Unsqueeze", {"x": np.array(5.0, np.float32)}, consts={"axes": i64(0)}, opset=13)
    assert got[0].shape == (1,)


def test_squeeze_inference() -> None:
    (t,) = infer("squeeze", [TensorType(DType.f32, (1, B, 1)), i64(0)])
    assert t.shape == (B, 1)
    (t,) = infer("squeeze", [TensorType(DType.f32, (1, B)), TensorType(DType.i64, (1,))])
    assert t.shape == (UNKNOWN,)
    with pytest.raises(ShapeError, match="size is 3, not 1"):
        infer("squeeze", [TensorType(DType.f32, (1, 3)), i64(1)])
    with pytest.raises(ShapeError, match="give the axes"):
        infer("squeeze", [TensorType(DType.f32, (1, B))])
    # a symbol known to be at least 2 is never squeezed
    (t,) = infer("squeeze", [TensorType(DType.f32, (1, B))], symbols={"b": SymbolInfo("b", min=2)})
    assert t.shape == (B,)


def test_unsqueeze_inference() -> None:
    (t,) = infer("unsqueeze", [TensorType(DType.f32, (B, H)), i64(0, -1)])
    assert t.shape == (1, B, H, 1)
    with pytest.raises(ShapeError, match="repeated axis"):
        infer("unsqueeze", [TensorType(DType.f32, (B, H)), i64(1, -3)])


# transpose -------------------------------------------------------------------


@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose_matches_ort(perm: list[int] | None) -> None:
    attrs = {} if perm is None else {"perm": perm}
    check_ort("Transpose", {"x": f32(2, 3, 4)}, **attrs)


def test_transpose_inference_and_errors() -> None:
    (t,) = infer("transpose", [TensorType(DType.f32, (B, 3, H))])
    assert t.shape == (H, 3, B)
    with pytest.raises(ShapeError, match="not a permutation"):
        infer("transpose", [TensorType(DType.f32, (B, 3))], perm=[0, 0])


# expand ----------------------------------------------------------------------


@pytest.mark.parametrize(("in_shape", "target"), [((3, 1), (2, 1, 6)), ((3, 4), (4,)), ((1,), (2, 3)), ((), (2,))])
def test_expand_matches_ort(in_shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    got = check_ort("Expand", {"x": f32(*in_shape)}, consts={"s": np.array(target, np.int64)})
    assert got[0].shape == np.broadcast_shapes(in_shape, target)


def test_expand_inference() -> None:
    (t,) = infer("expand", [TensorType(DType.f32, (B, 1)), i64(1, 5)])
    assert t.shape == (B, 5)
    # a run-time target: dims it cannot change stay known
    (t,) = infer("expand", [TensorType(DType.f32, (7, 3, 1)), TensorType(DType.i64, (2,))])
    assert t.shape == (7, 3, UNKNOWN)
    with pytest.raises(ShapeError, match="do not broadcast"):
        infer("expand", [TensorType(DType.f32, (3,)), i64(4)])


# shape / size ----------------------------------------------------------------


@pytest.mark.parametrize(("start", "end"), [(None, None), (1, None), (-1, None), (None, -1), (1, 2), (-10, 10), (2, 1)])
def test_shape_matches_ort(start: int | None, end: int | None) -> None:
    attrs = {k: v for k, v in {"start": start, "end": end}.items() if v is not None}
    check_ort("Shape", {"x": f32(2, 3, 4)}, opset=15, **attrs)


def test_shape_and_size_of_symbolic_input() -> None:
    x = TensorType(DType.f32, (B, 3, H))
    assert infer("shape", [x])[0] == TensorType(DType.i64, (3,))
    assert infer("shape", [x], start=1)[0] == TensorType(DType.i64, (2,))
    assert infer("size", [x])[0] == TensorType(DType.i64, ())


def test_size_matches_ort() -> None:
    got = check_ort("Size", {"x": f32(2, 3, 4)})
    assert got[0] == 24

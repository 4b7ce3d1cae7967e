"""concat, split, slice, tile, trilu and the generation ops (constant_of_shape, eye_like, range):
values against onnxruntime or NumPy, every opset form the importer upgrades, symbolic inference, errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from cuvil.errors import CuvilError, ModelError, ShapeError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN, ceildiv, sym
from cuvil.ir.types import SymbolInfo, TensorType
from tests.support.single_node import check_ort, f32, i64, infer, one_node, run_cuvil

B, H = sym("b"), sym("h")
INT_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


# concat --------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_matches_ort(axis: int) -> None:
    shapes = {0: [(1, 3), (2, 3), (0, 3)], 1: [(2, 1), (2, 4), (2, 2)], -1: [(2, 1), (2, 2), (2, 3)]}[axis]
    check_ort("Concat", {f"x{i}": f32(*s) for i, s in enumerate(shapes)}, axis=axis)


def test_concat_opset1_default_axis_is_1() -> None:
    a, b = f32(2, 1), f32(2, 3)
    model = one_node("Concat", {"a": a, "b": b}, opset=1)
    np.testing.assert_array_equal(run_cuvil(model, {"a": a, "b": b})[0], np.concatenate([a, b], axis=1))


def test_concat_symbolic_axis_sums_and_other_dims_merge() -> None:
    (t,) = infer("concat", [TensorType(DType.f32, (B, H)), TensorType(DType.f32, (B, 3)), TensorType(DType.f32, (B, H))],
                 axis=1)
    assert t.shape == (B, 2 * H + 3)
    (t,) = infer("concat", [TensorType(DType.f32, (B, 2)), TensorType(DType.f32, (4, 2))], axis=1)
    assert t.shape == (4, 4)
    with pytest.raises(ShapeError, match="differ in dim 0"):
        infer("concat", [TensorType(DType.f32, (3, 2)), TensorType(DType.f32, (4, 2))], axis=1)
    with pytest.raises(ShapeError, match="share one element type"):
        infer("concat", [TensorType(DType.f32, (3,)), TensorType(DType.i64, (4,))], axis=0)


# split ---------------------------------------------------------------------


def test_split_every_opset_form() -> None:
    x = f32(7, 2)
    outs = ("a", "b", "c")
    want = np.split(x, [2, 5])
    for model in (
        one_node("Split", {"x": x}, outputs=outs, opset=11, split=[2, 3, 2]),
        one_node("Split", {"x": x}, consts={"s": i64(2, 3, 2)}, outputs=outs, opset=13),
        one_node("Split", {"x": x}, consts={"s": i64(2, 3, 2)}, outputs=outs, opset=18),
    ):
        for g, w in zip(run_cuvil(model, {"x": x}), want):
            np.testing.assert_array_equal(g, w)
    # opset 18 num_outputs: ceil-sized parts, the last smaller (onnxruntime agrees)
    got = check_ort("Split", {"x": x}, outputs=outs, num_outputs=3)
    assert [g.shape[0] for g in got] == [3, 3, 1]


def test_split_equal_parts_before_opset_18_must_divide() -> None:
    x = f32(6, 2)
    got = run_cuvil(one_node("Split", {"x": x}, outputs=("a", "b", "c"), opset=13), {"x": x})
    assert [g.shape[0] for g in got] == [2, 2, 2]
    with pytest.raises(ModelError, match="equal parts"):
        run_cuvil(one_node("Split", {"x": f32(7, 2)}, outputs=("a", "b", "c"), opset=13), {"x": f32(7, 2)})


def test_split_inference() -> None:
    ts = infer("split", [TensorType(DType.f32, (2 * B, 3))], n_out=2, num_outputs=2)
    assert [t.shape for t in ts] == [(B, 3), (B, 3)]
    ts = infer("split", [TensorType(DType.f32, (B, 3))], n_out=2, num_outputs=2, axis=0)
    assert ts[0].shape == (ceildiv(B, 2), 3) and ts[1].shape == (B - ceildiv(B, 2), 3)
    ts = infer("split", [TensorType(DType.f32, (5, 3)), TensorType(DType.i64, (2,))], n_out=2)
    assert [t.shape for t in ts] == [(UNKNOWN, 3), (UNKNOWN, 3)]
    with pytest.raises(ShapeError, match="add up to 4"):
        infer("split", [TensorType(DType.f32, (5, 3)), i64(1, 3)], n_out=2)
    with pytest.raises(ShapeError, match="cannot split a dim of 5 into 4 parts"):
        infer("split", [TensorType(DType.f32, (5, 3))], n_out=4, num_outputs=4)


# slice ---------------------------------------------------------------------

SLICES = [
    # starts, ends, axes, steps
    ((0, 1), (2, 3), None, None),
    ((1,), (INT_MAX,), (1,), None),
    ((-3,), (-1,), (0,), None),
    ((10,), (20,), (0,), None),
    ((-100,), (2,), (-1,), None),
    ((INT64_MAX,), (-INT64_MAX,), (1,), (-1,)),
    ((4, 3), (0, -INT_MAX), (0, 1), (-2, -1)),
    ((0,), (INT_MAX,), (1,), (3,)),
]


@pytest.mark.parametrize(("starts", "ends", "axes", "steps"), SLICES)
def test_slice_matches_ort(starts: tuple[int, ...], ends: tuple[int, ...], axes: tuple[int, ...] | None,
                           steps: tuple[int, ...] | None) -> None:
    consts = {"starts": i64(*starts), "ends": i64(*ends)}
    order = ["x", "starts", "ends"]
    if axes is not None:
        consts["axes"] = i64(*axes)
        order.append("axes")
    if steps is not None:
        consts["steps"] = i64(*steps)
        order += ["axes"] if axes is None else []
        order.append("steps")
    check_ort("Slice", {"x": f32(6, 5)}, consts=consts, order=order)


def test_slice_opset1_attributes() -> None:
    x = f32(4, 5)
    model = one_node("Slice", {"x": x}, opset=9, starts=[1, -2], ends=[3, 1000], axes=[0, 1])
    np.testing.assert_array_equal(run_cuvil(model, {"x": x})[0], x[1:3, -2:])


def test_slice_runtime_bounds_give_unknown_dims_of_the_sliced_axes() -> None:
    ix = TensorType(DType.i64, (1,))
    (t,) = infer("slice", [TensorType(DType.f32, (4, 5)), ix, ix, i64(1)])
    assert t.shape == (4, UNKNOWN)
    (t,) = infer("slice", [TensorType(DType.f32, (4, 5)), i64(0), i64(1), ix])
    assert t.shape == (UNKNOWN, UNKNOWN)


def test_slice_symbolic_dims() -> None:
    x = TensorType(DType.f32, (B, H))
    assert infer("slice", [x, i64(0), i64(INT_MAX), i64(1)])[0].shape == (B, H)
    assert infer("slice", [x, i64(INT64_MAX), i64(-INT64_MAX), i64(1), i64(-1)])[0].shape == (B, H)
    assert infer("slice", [x, i64(0), i64(INT_MAX), i64(1), i64(2)])[0].shape == (B, ceildiv(H, 2))
    # h may be smaller than 1, so h[1:] is not h - 1 ... unless the symbol says h >= 1
    assert infer("slice", [x, i64(1), i64(INT_MAX), i64(1)])[0].shape == (B, UNKNOWN)
    hmin = {"h": SymbolInfo("h", min=4)}
    assert infer("slice", [x, i64(1), i64(INT_MAX), i64(1)], hmin)[0].shape == (B, H - 1)
    assert infer("slice", [x, i64(-3), i64(-1), i64(1)], hmin)[0].shape == (B, 2)
    assert infer("slice", [x, i64(0), i64(3), i64(1)], hmin)[0].shape == (B, 3)


def test_slice_errors() -> None:
    x = TensorType(DType.f32, (4, 5))
    with pytest.raises(ShapeError, match="must not be 0"):
        infer("slice", [x, i64(0), i64(1), i64(0), i64(0)])
    with pytest.raises(ShapeError, match="one length"):
        infer("slice", [x, i64(0, 1), i64(1)])
    with pytest.raises(ShapeError, match="out of range"):
        infer("slice", [x, i64(0), i64(1), i64(2)])


# tile ----------------------------------------------------------------------


def test_tile_matches_ort_and_symbolic() -> None:
    check_ort("Tile", {"x": f32(2, 3)}, consts={"r": i64(3, 2)})
    (t,) = infer("tile", [TensorType(DType.f32, (B, 3)), i64(2, 1)])
    assert t.shape == (2 * B, 3)
    with pytest.raises(ShapeError, match="repeats has 1 entries"):
        infer("tile", [TensorType(DType.f32, (B, 3)), i64(2)])


def test_tile_opset1_form() -> None:
    x = f32(2, 3)
    model = one_node("Tile", {"x": x}, consts={"tiles": np.array(3, np.int64), "axis": np.array(1, np.int64)}, opset=1)
    np.testing.assert_array_equal(run_cuvil(model, {"x": x})[0], np.tile(x, (1, 3)))


# trilu ---------------------------------------------------------------------


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-2, 0, 1, 4])
def test_trilu_matches_ort(upper: int, k: int) -> None:
    check_ort("Trilu", {"x": f32(2, 3, 4)}, consts={"k": np.array(k, np.int64)}, upper=upper, opset=14)


def test_trilu_needs_a_matrix() -> None:
    with pytest.raises(ShapeError, match="rank 2 or more"):
        infer("trilu", [TensorType(DType.f32, (3,))])


# constant_of_shape / eye_like / range ------------------------------------------


def test_constant_of_shape() -> None:
    value = helper.make_tensor("v", 6, [1], [7])  # int32 7
    got = check_ort("ConstantOfShape", {"s": i64(2, 3)}, value=value)
    assert got[0].dtype == np.int32 and (got[0] == 7).all()
    got = check_ort("ConstantOfShape", {"s": i64(0)})
    assert got[0].dtype == np.float32 and got[0].shape == (0,)
    (t,) = infer("constant_of_shape", [TensorType(DType.i64, (3,))])
    assert t == TensorType(DType.f32, (UNKNOWN,) * 3)


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_eye_like(k: int) -> None:
    got = check_ort("EyeLike", {"x": np.zeros((3, 4), np.int32)}, k=k, dtype=11)
    assert got[0].dtype == np.float64
    np.testing.assert_array_equal(got[0], np.eye(3, 4, k))
    with pytest.raises(ShapeError, match="must be 2-D"):
        infer("eye_like", [TensorType(DType.f32, (3,))])


@pytest.mark.parametrize(
    ("start", "limit", "delta", "dtype"),
    [(1, 10, 3, np.int32), (10, 4, -2, np.int64), (0.5, 3.0, 0.7, np.float32), (5, 1, 2, np.int16), (1.0, 2.0, 0.25, np.float64)],
)
def test_range_matches_ort(start: float, limit: float, delta: float, dtype: type) -> None:
    ins = {"a": np.array(start, dtype), "b": np.array(limit, dtype), "c": np.array(delta, dtype)}
    model = one_node("Range", ins, opset=11)
    got = run_cuvil(model, ins)
    from tests.support.single_node import run_ort

    want = run_ort(model, ins, got)
    assert got[0].dtype == want[0].dtype and got[0].shape == want[0].shape
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_range_constant_inputs_give_a_static_length_and_f16_uses_stash_type() -> None:
    (t,) = infer("range", [np.array(0, np.int64), np.array(10, np.int64), np.array(3, np.int64)])
    assert t.shape == (4,)
    (t,) = infer("range", [TensorType(DType.i64, ()), np.array(10, np.int64), np.array(3, np.int64)])
    assert t.shape == (UNKNOWN,)
    # 2048 + 1 is not an f16: added up in f16 the sequence would stall, in f32 it does not
    ins = {"a": np.array(2040, np.float16), "b": np.array(2060, np.float16), "c": np.array(1, np.float16)}
    got = run_cuvil(one_node("Range", ins, opset=21), ins)[0]
    np.testing.assert_array_equal(got, np.arange(2040, 2060, dtype=np.float32).astype(np.float16))
    with pytest.raises(ShapeError, match="delta must not be 0"):
        infer("range", [np.array(0, np.int64), np.array(10, np.int64), np.array(0, np.int64)])


def test_range_reference_rejects_zero_delta() -> None:
    ins = {"a": np.array(0, np.int64), "b": np.array(3, np.int64), "c": np.array(0, np.int64)}
    with pytest.raises(CuvilError, match="delta must not be 0"):
        run_cuvil(one_node("Range", ins, opset=11), ins)


def test_range_over_a_size_from_shapes_has_a_symbolic_length_where_it_cannot_be_negative() -> None:
    """arange(seq), arange(seq, 0, -3): a length in ``seq``; arange(1, seq, 2) may be empty: unknown."""
    import onnx

    from cuvil.api import compile as cuvil_compile
    from tests.support.single_node import run_ort

    i64_ = onnx.TensorProto.INT64
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["up"]),
             helper.make_node("Range", ["n", "zero", "minus3"], ["down"]),
             helper.make_node("Range", ["one", "n", "two"], ["odd"])]
    consts = [helper.make_tensor(k, i64_, [], [v]) for k, v in (("zero", 0), ("one", 1), ("two", 2), ("minus3", -3))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", "seq"])],
                              [helper.make_tensor_value_info(k, i64_, None) for k in ("up", "down", "odd")], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    seq = sym("seq")
    for target in ("ref", "native"):
        m = cuvil_compile(model, target=target)
        assert [s.type.shape for s in m.output_specs] == [(seq,), (ceildiv(seq, 3),), (UNKNOWN,)]
        for n in (0, 1, 2, 7):
            x = np.zeros((2, n), np.float32)
            got = list(m.run({"x": x}).values())
            for g, w in zip(got, run_ort(model, {"x": x}, got)):
                np.testing.assert_array_equal(g, w)

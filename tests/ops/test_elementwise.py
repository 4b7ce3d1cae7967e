"""Elementwise ops, activations, comparisons and logic, cast, constant, identity and dropout:
checked against onnxruntime and hand-computed values, across the opset forms the importer
upgrades, with symbolic shapes and with the errors bad models must raise."""

from __future__ import annotations

import math
from collections.abc import Sequence

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.backends.ref.interpreter import run_graph
from cuvil.errors import CuvilError, ModelError, ShapeError, UnsupportedOpError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import ALL, DType
from cuvil.ir.symbolic import evaluate, sym
from cuvil.ir.types import TensorType
from tests.support.single_node import check_close as check_against_ort
from tests.support.single_node import one_node, run_cuvil

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(0)
BF16 = np.dtype(ml_dtypes.bfloat16)


def make_model(op_type: str, inputs: dict[str, np.ndarray], outputs: Sequence[str] = ("y",), opset: int = 21,
               **kw: object) -> onnx.ModelProto:
    """A one-node model at opset 21 unless told."""
    return one_node(op_type, inputs, outputs, opset, **kw)  # type: ignore[arg-type]


# Unary math and activations against onnxruntime --------------------------------

# op -> (input sampler, attributes)
UNARY: dict[str, tuple[str, dict[str, object]]] = {
    "Abs": ("normal", {}),
    "Neg": ("normal", {}),
    "Sign": ("normal", {}),
    "Ceil": ("normal", {}),
    "Floor": ("normal", {}),
    "Round": ("normal", {}),
    "Reciprocal": ("positive", {}),
    "Sqrt": ("positive", {}),
    "Exp": ("normal", {}),
    "Log": ("positive", {}),
    "Erf": ("normal", {}),
    "Sin": ("normal", {}),
    "Cos": ("normal", {}),
    "Tan": ("unit", {}),
    "Asin": ("unit", {}),
    "Acos": ("unit", {}),
    "Atan": ("normal", {}),
    "Sinh": ("normal", {}),
    "Cosh": ("normal", {}),
    "Tanh": ("normal", {}),
    "Asinh": ("normal", {}),
    "Acosh": ("above_one", {}),
    "Atanh": ("unit", {}),
    "Relu": ("normal", {}),
    "LeakyRelu": ("normal", {"alpha": 0.2}),
    "Elu": ("normal", {"alpha": 0.7}),
    "Celu": ("normal", {"alpha": 1.5}),
    "Selu": ("normal", {}),
    "ThresholdedRelu": ("normal", {"alpha": 0.3}),
    "Sigmoid": ("wide", {}),
    "HardSigmoid": ("wide", {"alpha": 0.3, "beta": 0.4}),
    "HardSwish": ("wide", {}),
    "Softplus": ("wide", {}),
    "Softsign": ("wide", {}),
    "Mish": ("normal", {}),
    "Shrink": ("normal", {"bias": 0.25, "lambd": 0.5}),
}


def sample(kind: str, shape: tuple[int, ...], dtype: type = np.float32) -> np.ndarray:
    x = RNG.standard_normal(shape)
    if kind == "positive":
        x = np.abs(x) + 0.1
    elif kind == "unit":
        x = np.tanh(x) * 0.95
    elif kind == "above_one":
        x = np.abs(x) + 1.05
    elif kind == "wide":
        x = x * 10
    return x.astype(dtype)


@pytest.mark.parametrize("op_type", sorted(UNARY))
def test_unary_matches_onnxruntime(op_type: str) -> None:
    kind, attrs = UNARY[op_type]
    inputs = {"x": sample(kind, (3, 4, 5))}
    check_against_ort(make_model(op_type, inputs, opset=18 if op_type in ("Mish",) else 17, **attrs), inputs)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_formula(approximate: str) -> None:
    x = sample("wide", (2, 50))
    (y,) = run_cuvil(make_model("Gelu", {"x": x}, opset=20, approximate=approximate), {"x": x})
    x64 = x.astype(np.float64)
    if approximate == "none":
        want = 0.5 * x64 * (1 + np.vectorize(math.erf)(x64 / math.sqrt(2)))
    else:
        want = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-7)


def test_half_precision_is_computed_in_float32_and_rounded_once() -> None:
    # exp(12) overflows float16, so a float16 computation of sigmoid(-12) would give 0
    x = np.array([-12.0, -3.0, 0.0, 5.0], np.float16)
    (y,) = run_cuvil(make_model("Sigmoid", {"x": x}), {"x": x})
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, (1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float16))
    xb = x.astype(BF16)
    (yb,) = run_cuvil(make_model("Softplus", {"x": xb}, opset=22), {"x": xb})
    assert yb.dtype == BF16
    np.testing.assert_array_equal(yb, np.log1p(np.exp(xb.astype(np.float64))).astype(np.float32).astype(BF16))


def test_integer_unary_ops() -> None:
    x = np.array([-128, -3, 0, 7, 127], np.int8)
    for op_type, want in {
        "Abs": np.array([-128, 3, 0, 7, 127], np.int8),  # the most negative value wraps, as in C
        "Neg": np.array([-128, 3, 0, -7, -127], np.int8),
        "Sign": np.array([-1, -1, 0, 1, 1], np.int8),
        "Relu": np.array([0, 0, 0, 7, 127], np.int8),
    }.items():
        (y,) = run_cuvil(make_model(op_type, {"x": x}), {"x": x})
        np.testing.assert_array_equal(y, want, err_msg=op_type)


def test_shrink_on_integers_truncates_like_onnx() -> None:
    x = np.array([-5, -1, 0, 1, 5], np.int32)
    (y,) = run_cuvil(make_model("Shrink", {"x": x}, opset=9, bias=1.5, lambd=1.0), {"x": x})
    np.testing.assert_array_equal(y, np.array([-3, 0, 0, 0, 3], np.int32))


# Binary arithmetic --------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_arithmetic_matches_onnxruntime(op_type: str, dtype: type) -> None:
    if np.dtype(dtype).kind == "f":
        a, b = sample("normal", (2, 3, 4), dtype), sample("positive", (3, 1), dtype)
    else:
        a = RNG.integers(0, 100, (2, 3, 4)).astype(dtype)
        b = RNG.integers(1, 9, (3, 1)).astype(dtype)
    check_against_ort(make_model(op_type, {"a": a, "b": b}, opset=14), {"a": a, "b": b})


def test_integer_division_truncates_toward_zero() -> None:
    a = np.array([-7, 7, -7, 7, -6, 6, np.iinfo(np.int32).min], np.int32)
    b = np.array([2, 2, -2, -2, 3, -3, 1], np.int32)
    (y,) = run_cuvil(make_model("Div", {"a": a, "b": b}), {"a": a, "b": b})
    np.testing.assert_array_equal(y, np.array([-3, 3, 3, -3, -2, -2, np.iinfo(np.int32).min], np.int32))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.float32, np.float64])
def test_mod_signs(fmod: int, dtype: type) -> None:
    a = np.array([-7, 7, -7, 7, 5, -5], dtype)
    b = np.array([3, -3, -3, 3, 5, 2], dtype)
    if np.dtype(dtype).kind == "f":
        a, b = a + np.asarray(0.5, dtype), b
    want = np.fmod(a, b) if fmod else a - np.floor_divide(a, b) * b
    (y,) = run_cuvil(make_model("Mod", {"a": a, "b": b}, fmod=fmod), {"a": a, "b": b})
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_allclose(y, want)
    if fmod == 1 or np.dtype(dtype).kind != "f":  # onnxruntime refuses fmod=0 on floats (opset < 28)
        check_against_ort(make_model("Mod", {"a": a, "b": b}, opset=13, fmod=fmod), {"a": a, "b": b})


@pytest.mark.parametrize(
    ("base", "exponent", "want"),
    [
        (np.array([2, 3, -2], np.int32), np.array([3.0, 0.5, 2.0], np.float32), np.array([8, 1, 4], np.int32)),
        (np.array([2, -1, -1, 1, 5, 0], np.int64), np.array([10, 3, -3, -4, -1, 0], np.int64),
         np.array([1024, -1, -1, 1, 0, 1], np.int64)),
        (np.array([2.0, 4.0], np.float32), np.array([-1, 3], np.int64), np.array([0.5, 64.0], np.float32)),
        (np.array([3], np.int32), np.array([21], np.int32), np.array([(3**21 + 2**31) % 2**32 - 2**31], np.int32)),
    ],
)
def test_pow_mixed_types(base: np.ndarray, exponent: np.ndarray, want: np.ndarray) -> None:
    (y,) = run_cuvil(make_model("Pow", {"a": base, "b": exponent}, opset=15), {"a": base, "b": exponent})
    assert y.dtype == base.dtype
    np.testing.assert_array_equal(y, want)


def test_pow_float_matches_onnxruntime() -> None:
    a, b = sample("positive", (4, 5)), sample("normal", (5,))
    check_against_ort(make_model("Pow", {"a": a, "b": b}, opset=15), {"a": a, "b": b})


def test_prelu_broadcasts_slope_to_x() -> None:
    x, slope = sample("normal", (2, 3, 4)), sample("positive", (3, 1))
    check_against_ort(make_model("PRelu", {"x": x, "slope": slope}, opset=16), {"x": x, "slope": slope})
    with pytest.raises(ModelError, match="must broadcast to the shape of X"):
        make = make_model("PRelu", {"x": x[:, :1, :1], "slope": slope})
        cuvil.compile(make)


# Variadic ops ----------------------------------------------------------------------


@pytest.mark.parametrize(("op_type", "fn"), [("Max", np.maximum), ("Min", np.minimum), ("Sum", np.add)])
def test_variadic_broadcast(op_type: str, fn: np.ufunc) -> None:
    xs = {"a": sample("normal", (3, 1)), "b": sample("normal", (4,)), "c": sample("normal", (2, 1, 1))}
    (y,) = run_cuvil(make_model(op_type, xs), xs)
    np.testing.assert_allclose(y, fn(fn(xs["a"], xs["b"]), xs["c"]), rtol=1e-6)
    (one,) = run_cuvil(make_model(op_type, {"a": xs["a"]}), {"a": xs["a"]})
    np.testing.assert_array_equal(one, xs["a"])


def test_mean_and_integer_max() -> None:
    xs = {"a": sample("normal", (3, 4)), "b": sample("normal", (4,)), "c": sample("normal", (1, 4))}
    check_against_ort(make_model("Mean", xs, opset=13), xs)
    ints = {"a": np.array([1, -5, 3], np.int32), "b": np.array([[0], [9]], np.int32)}
    check_against_ort(make_model("Max", ints, opset=13), ints)


def test_variadic_before_opset_8_needs_equal_shapes() -> None:
    xs = {"a": sample("normal", (3, 4)), "b": sample("normal", (4,))}
    with pytest.raises(ModelError, match="equal shapes"):
        cuvil.compile(make_model("Sum", xs, opset=6))


# Comparisons, logic, where ------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"])
def test_comparisons(op_type: str) -> None:
    a = RNG.integers(-3, 3, (2, 3, 4)).astype(np.int32)
    b = RNG.integers(-3, 3, (3, 1)).astype(np.int32)
    (y,) = check_against_ort(make_model(op_type, {"a": a, "b": b}, opset=16), {"a": a, "b": b})
    assert y.dtype == np.bool_


@pytest.mark.parametrize(("op_type", "fn"), [("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)])
def test_logic(op_type: str, fn: np.ufunc) -> None:
    a, b = RNG.random((3, 4)) > 0.5, RNG.random((4,)) > 0.5
    (y,) = run_cuvil(make_model(op_type, {"a": a, "b": b}), {"a": a, "b": b})
    np.testing.assert_array_equal(y, fn(a, b))
    (n,) = run_cuvil(make_model("Not", {"a": a}), {"a": a})
    np.testing.assert_array_equal(n, ~a)


def test_logic_needs_bool() -> None:
    a = np.ones(3, np.int32)
    with pytest.raises(ModelError, match="element type i32"):
        cuvil.compile(make_model("And", {"a": a, "b": a}))


def test_is_nan_is_inf() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0], np.float32)
    (nan,) = run_cuvil(make_model("IsNaN", {"x": x}), {"x": x})
    np.testing.assert_array_equal(nan, [True, False, False, False, False])
    for pos, neg, want in [(1, 1, [0, 1, 1, 0, 0]), (1, 0, [0, 1, 0, 0, 0]), (0, 1, [0, 0, 1, 0, 0])]:
        model = make_model("IsInf", {"x": x}, detect_positive=pos, detect_negative=neg)
        (inf,) = run_cuvil(model, {"x": x})
        np.testing.assert_array_equal(inf, np.array(want, bool))


def test_where_broadcasts_three_inputs() -> None:
    c = RNG.random((2, 1, 4)) > 0.5
    inputs = {"c": c, "x": sample("normal", (3, 1)), "z": sample("normal", (4,))}
    (out,) = check_against_ort(make_model("Where", inputs, opset=16), inputs)
    assert out.shape == (2, 3, 4)


# Clip ------------------------------------------------------------------------------------


def test_clip_inputs_and_attribute_forms() -> None:
    x = np.array([-5.0, -1.0, 0.5, 3.0, np.inf, -np.inf], np.float32)
    lo, hi = np.array(-2.0, np.float32), np.array(2.0, np.float32)
    (y,) = run_cuvil(make_model("Clip", {"x": x}, opset=13, consts={"lo": lo, "hi": hi}), {"x": x})
    np.testing.assert_array_equal(y, [-2, -1, 0.5, 2, 2, -2])
    (only_max,) = run_cuvil(make_model("Clip", {"x": x}, opset=13, consts={"hi": hi}, order=["x", "", "hi"]), {"x": x})
    np.testing.assert_array_equal(only_max, [-5, -1, 0.5, 2, 2, -np.inf])
    (old,) = run_cuvil(make_model("Clip", {"x": x}, opset=6, min=-1.0, max=1.0), {"x": x})
    np.testing.assert_array_equal(old, [-1, -1, 0.5, 1, 1, -1])
    # opset 6's defaults are the float range's ends: infinities become finite
    f32max = np.finfo(np.float32).max
    (defaults,) = run_cuvil(make_model("Clip", {"x": x}, opset=6), {"x": x})
    np.testing.assert_array_equal(defaults, [-5, -1, 0.5, 3, f32max, -f32max])
    # min above max gives max everywhere
    (crossed,) = run_cuvil(make_model("Clip", {"x": x}, opset=13, consts={"lo": hi, "hi": lo}), {"x": x})
    np.testing.assert_array_equal(crossed, np.full(6, -2.0, np.float32))
    ints = np.array([-100, 0, 100], np.int8)
    (yi,) = run_cuvil(make_model("Clip", {"x": ints}, opset=13, consts={"lo": np.array(-5, np.int8)}), {"x": ints})
    np.testing.assert_array_equal(yi, [-5, 0, 100])


def test_clip_bounds_must_be_scalars_of_x_type() -> None:
    x = sample("normal", (3,))
    with pytest.raises(ModelError, match="must be a scalar"):
        cuvil.compile(make_model("Clip", {"x": x}, opset=13, consts={"lo": np.zeros(3, np.float32)}))
    with pytest.raises(ModelError, match="element type f64"):
        cuvil.compile(make_model("Clip", {"x": x}, opset=13, consts={"lo": np.zeros((), np.float64)}))


# Older opset forms ----------------------------------------------------------------------------


def test_legacy_broadcast_with_axis_reshapes_a_constant_b() -> None:
    a = sample("normal", (2, 3, 4, 5))
    b = sample("normal", (3, 4))
    model = make_model("Add", {"a": a}, opset=6, consts={"b": b}, broadcast=1, axis=1)
    (y,) = run_cuvil(model, {"a": a})
    np.testing.assert_allclose(y, a + b[None, :, :, None])
    trailing = make_model("Mul", {"a": a}, opset=6, consts={"b": b[0, :4, None].repeat(5, 1)}, broadcast=1)
    (y2,) = run_cuvil(trailing, {"a": a})
    np.testing.assert_allclose(y2, a * b[0, :4, None].repeat(5, 1))
    one = {"b": np.ones(1, np.float32)}
    scalar = make_model("Sub", {"a": a}, opset=1, consts=one, broadcast=1, consumed_inputs=[0])
    (y3,) = run_cuvil(scalar, {"a": a})
    np.testing.assert_allclose(y3, a - 1)


def test_legacy_broadcast_errors() -> None:
    a, b = sample("normal", (2, 3, 4)), sample("normal", (3,))
    with pytest.raises(ModelError, match="equal shapes"):
        cuvil.compile(make_model("Add", {"a": a, "b": b}, opset=6))
    with pytest.raises(UnsupportedOpError, match="run time"):
        cuvil.compile(make_model("Add", {"a": a, "b": b}, opset=6, broadcast=1, axis=1))
    with pytest.raises(ModelError, match="does not match"):
        cuvil.compile(make_model("Add", {"a": a, "b": b}, opset=6, broadcast=1))
    # the attributes are gone from opset 7 on
    with pytest.raises(ModelError, match="broadcast"):
        cuvil.compile(make_model("Add", {"a": a, "b": b}, opset=7, broadcast=1))


def test_opset_1_selu_defaults_and_consumed_inputs() -> None:
    x = sample("normal", (10,))
    (y,) = run_cuvil(make_model("Selu", {"x": x}, opset=1, consumed_inputs=[0]), {"x": x})
    alpha, gamma = float(np.float32(1.6732)), float(np.float32(1.0507))
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, gamma * np.where(x64 > 0, x64, alpha * np.expm1(x64)), rtol=1e-6)


def test_op_newer_than_model_opset_is_refused() -> None:
    x = sample("normal", (3,))
    with pytest.raises(UnsupportedOpError, match="HardSwish"):
        cuvil.compile(make_model("HardSwish", {"x": x}, opset=13))


# Cast, CastLike --------------------------------------------------------------------------------

_CASTABLE = [d for d in sorted(ALL, key=str)]
_VALUES = np.array([0.0, 1.0, -1.0, 2.5, -2.5, 100.0, 0.375], np.float64)  # exact in every float type


def _values_for(dt: DType) -> np.ndarray:
    if dt is DType.bool:
        return np.array([True, False, True, True, False, True, True])
    if dt.is_int and not dt.is_signed:
        return np.abs(_VALUES).astype(dt.np)
    return _VALUES.astype(dt.np)


@pytest.mark.parametrize("src", _CASTABLE, ids=str)
def test_cast_every_pair(src: DType) -> None:
    for dst in _CASTABLE:
        x = _values_for(src)
        if dst.is_int and not dst.is_signed and src is not DType.bool:
            x = np.abs(x)  # a negative value out of an unsigned type's range is undefined in ONNX
        to = helper.np_dtype_to_tensor_dtype(dst.np)
        (y,) = run_cuvil(make_model("Cast", {"x": x}, to=to), {"x": x})
        assert y.dtype == dst.np, (src, dst)
        if dst is DType.bool:
            want = x.astype(np.float64) != 0
        elif src is DType.bool:
            want = x.astype(dst.np)
        else:
            want = np.trunc(x.astype(np.float64)) if dst.is_int else x.astype(np.float64)
        np.testing.assert_array_equal(y.astype(np.float64), want.astype(np.float64), err_msg=f"{src}->{dst}")


def test_cast_integer_wraps_and_float_rounds_to_nearest_even() -> None:
    x = np.array([200, -129, 256], np.int32)
    (y,) = run_cuvil(make_model("Cast", {"x": x}, to=TensorProto.INT8), {"x": x})
    np.testing.assert_array_equal(y, np.array([-56, 127, 0], np.int8))
    # 1 + 2**-8 is halfway between two bfloat16 values: it rounds to the even one, 1.0
    f = np.array([1 + 2**-8, 1 + 3 * 2**-8, np.nan, -np.inf], np.float32)
    (b,) = run_cuvil(make_model("Cast", {"x": f}, to=TensorProto.BFLOAT16), {"x": f})
    np.testing.assert_array_equal(b.astype(np.float32), [1.0, 1 + 2**-6, np.nan, -np.inf])


def test_cast_forms() -> None:
    x = sample("normal", (2, 3))
    (old,) = run_cuvil(make_model("Cast", {"x": x}, opset=1, to="DOUBLE"), {"x": x})
    assert old.dtype == np.float64
    f8_attrs = make_model("Cast", {"x": x}, opset=25, to=TensorProto.FLOAT16, saturate=0, round_mode="down")
    (sat,) = run_cuvil(f8_attrs, {"x": x})
    np.testing.assert_array_equal(sat, x.astype(np.float16))
    like = {"x": x, "t": np.zeros((1,), np.int64)}
    (cl,) = run_cuvil(make_model("CastLike", like, opset=15), like)
    np.testing.assert_array_equal(cl, x.astype(np.int64))
    (f8,) = run_cuvil(make_model("Cast", {"x": x}, opset=19, to=TensorProto.FLOAT8E4M3FN), {"x": x})
    assert f8.dtype.name == "float8_e4m3fn"  # the low-bit types: tests/ops/test_lowbit.py
    with pytest.raises(UnsupportedOpError, match="cast to FLOAT8E8M0"):
        cuvil.compile(make_model("Cast", {"x": x}, opset=25, to=TensorProto.FLOAT8E8M0))
    with pytest.raises(UnsupportedOpError, match="cast to STRING"):
        cuvil.compile(make_model("Cast", {"x": x}, to=TensorProto.STRING))
    with pytest.raises(ModelError, match="round_mode"):
        cuvil.compile(make_model("Cast", {"x": x}, opset=25, to=TensorProto.FLOAT, round_mode="sideways"))
    with pytest.raises(ModelError, match="'to' is required"):
        cuvil.compile(make_model("Cast", {"x": x}))


# Constant, Identity, Dropout ---------------------------------------------------------------------


_GRID = np.arange(6, dtype=np.int32).reshape(2, 3)


@pytest.mark.parametrize(
    ("attr", "value", "want"),
    [
        ("value", numpy_helper.from_array(_GRID), _GRID),
        ("value_float", 1.5, np.array(1.5, np.float32)),
        ("value_floats", [1.0, 2.0], np.array([1.0, 2.0], np.float32)),
        ("value_int", 7, np.array(7, np.int64)),
        ("value_ints", [3, 4, 5], np.array([3, 4, 5], np.int64)),
    ],
)
def test_constant_forms(attr: str, value: object, want: np.ndarray) -> None:
    node = helper.make_node("Constant", [], ["y"], **{attr: value})  # type: ignore[arg-type]
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    (y,) = cuvil.compile(model)()
    assert y.dtype == want.dtype and y.shape == want.shape
    np.testing.assert_array_equal(y, want)


def test_constant_strings_are_unsupported() -> None:
    node = helper.make_node("Constant", [], ["y"], value_string="hello")
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(UnsupportedOpError, match="value_string"):
        cuvil.compile(model)


def test_identity_and_inference_dropout() -> None:
    x = sample("normal", (2, 3))
    (same,) = run_cuvil(make_model("Identity", {"x": x}), {"x": x})
    np.testing.assert_array_equal(same, x)
    for opset, mask_dtype in [(7, np.float32), (10, np.bool_), (13, np.bool_)]:
        y, mask = run_cuvil(make_model("Dropout", {"x": x}, ("y", "mask"), opset=opset), {"x": x})
        np.testing.assert_array_equal(y, x)
        assert mask.dtype == mask_dtype and mask.shape == x.shape and np.all(mask == 1)
    ratio = {"x": x, "r": np.array(0.3, np.float32)}
    y, mask = run_cuvil(make_model("Dropout", ratio, ("y", "mask"), opset=13), ratio)
    np.testing.assert_array_equal(y, x)
    off = make_model("Dropout", {"x": x}, opset=13, consts={"r": np.array(0.5, np.float32), "t": np.array(False)})
    np.testing.assert_array_equal(run_cuvil(off, {"x": x})[0], x)
    (test_mode,) = run_cuvil(make_model("Dropout", {"x": x}, opset=6, is_test=1), {"x": x})
    np.testing.assert_array_equal(test_mode, x)


def test_training_dropout_is_refused() -> None:
    x = sample("normal", (2, 3))
    on = make_model("Dropout", {"x": x}, opset=13, consts={"r": np.array(0.5, np.float32), "t": np.array(True)})
    with pytest.raises(UnsupportedOpError, match="training_mode=true"):
        cuvil.compile(on)
    runtime = {"x": x, "r": np.array(0.5, np.float32), "t": np.array(False)}
    with pytest.raises(UnsupportedOpError, match="run time"):
        cuvil.compile(make_model("Dropout", runtime, opset=13))
    with pytest.raises(UnsupportedOpError, match="is_test=0"):
        cuvil.compile(make_model("Dropout", {"x": x}, opset=6))
    with pytest.raises(ModelError, match=r"ratio must be in \[0, 1\)"):
        cuvil.compile(make_model("Dropout", {"x": x}, opset=10, ratio=1.5))


# Inference: symbolic shapes and bad inputs ---------------------------------------------------------


def test_symbolic_broadcast_and_full_like() -> None:
    b = Builder()
    n, m = sym("n"), sym("m")
    x = b.input("x", TensorType(DType.f32, (n, 1, m)))
    s = b.input("s", TensorType(DType.f32, (3, 1)))
    c = b.input("c", TensorType(DType.bool, (m,)))
    y = b.add1("add", [x, s])
    w = b.add1("where", [c, y, x])
    mask = b.add1("full_like", [w], {"value": np.array(True)})
    p = b.add1("prelu", [x, b.add1("constant", [], {"value": np.ones((1,), np.float32)})])
    assert y.type == TensorType(DType.f32, (n, 3, m))
    assert w.type == TensorType(DType.f32, (n, 3, m)) and mask.type == TensorType(DType.bool, (n, 3, m))
    assert p.type == x.type
    b.output(w, mask, p)
    env = {"n": 2, "m": 5}
    xs = [RNG.standard_normal((2, 1, 5)).astype(np.float32), np.ones((3, 1), np.float32), np.ones(5, bool)]
    outs = run_graph(b.graph, xs)
    assert [o.shape for o in outs] == [tuple(evaluate(d, env) for d in v.type.shape) for v in b.graph.outputs]
    assert outs[1].dtype == np.bool_ and outs[1].all()


def infer_error(op: str, types: list[TensorType], attrs: dict[str, object] | None = None) -> str:
    b = Builder()
    ins = [b.input(f"x{i}", t) for i, t in enumerate(types)]
    with pytest.raises(ShapeError) as info:
        b.add(op, ins, attrs or {})
    return str(info.value)


def test_inference_errors_name_the_problem() -> None:
    f32, i32 = DType.f32, DType.i32
    assert "share one element type" in infer_error("add", [TensorType(f32, (2,)), TensorType(i32, (2,))])
    assert "do not broadcast" in infer_error("mul", [TensorType(f32, (2, 3)), TensorType(f32, (4,))])
    assert "element type i32" in infer_error("exp", [TensorType(i32, (2,))])
    assert "element type u8" in infer_error("neg", [TensorType(DType.u8, (2,))])
    assert "element type f32" in infer_error("not", [TensorType(f32, (2,))])
    assert "fmod must be 0 or 1" in infer_error("mod", [TensorType(i32, (2,))] * 2, {"fmod": 2})
    assert "approximate" in infer_error("gelu", [TensorType(f32, (2,))], {"approximate": "fast"})
    assert "alpha must be nonzero" in infer_error("celu", [TensorType(f32, (2,))], {"alpha": 0.0})
    assert "at least one input" in infer_error("max", [])
    assert "condition" in infer_error("where", [TensorType(f32, (2,))] * 3) or "element type f32" in infer_error(
        "where", [TensorType(f32, (2,))] * 3
    )
    assert "one-element" in infer_error("full_like", [TensorType(f32, (2,))], {"value": np.zeros(2)})
    assert "unknown attribute" in infer_error("add", [TensorType(f32, (2,))] * 2, {"axis": 1})


def test_errors_reach_the_user_as_cuvil_errors() -> None:
    x = np.ones((2,), np.float32)
    with pytest.raises(CuvilError, match="Gelu"):
        cuvil.compile(make_model("Gelu", {"x": x}, opset=20, approximate="fast"))


def test_text_form_round_trips() -> None:
    from cuvil.frontends.onnx import load_onnx
    from cuvil.ir.equality import graph_difference
    from cuvil.ir.parser import parse_graph
    from cuvil.ir.printer import print_graph
    from cuvil.ir.verify import verify

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    nodes = [
        helper.make_node("Dropout", ["x"], ["d", "mask"]),
        helper.make_node("Gelu", ["d"], ["g"], approximate="tanh"),
        helper.make_node("Cast", ["g"], ["h"], to=TensorProto.FLOAT16),
        helper.make_node("IsInf", ["h"], ["i"], detect_negative=0),
        helper.make_node("Clip", ["x", "", "hi"], ["c"]),
        helper.make_node("Mod", ["c", "c"], ["m"], fmod=1),
        helper.make_node("Where", ["mask", "m", "x"], ["w"]),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in ("i", "w")]
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    graph = helper.make_graph(nodes, "g", [x], outs, [hi])
    g = load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=8))
    verify(g)
    text = print_graph(g)
    again = parse_graph(text)
    assert graph_difference(g, again) is None
    assert print_graph(again) == text


def test_prelu_keeps_x_shape_with_symbolic_dims() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("n"), sym("c"))))
    slope = b.add1("constant", [], {"value": np.full((4,), 0.25, np.float32)})
    y = b.add1("prelu", [x, slope])
    assert y.type == x.type  # c must be 4 (or the model is invalid): X's shape either way
    b.output(y)
    data = np.array([[-4.0, 4.0, -1.0, 0.0]], np.float32)
    np.testing.assert_array_equal(run_graph(b.graph, [data])[0], [[-1.0, 4.0, -0.25, 0.0]])
    with pytest.raises(ShapeError, match="must broadcast"):
        b.add1("prelu", [b.input("z", TensorType(DType.f32, (sym("n"), 3))), slope])

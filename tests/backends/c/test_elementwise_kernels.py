"""Elementwise C kernels (arithmetic, math, activations, logic, cast, full_like) against the reference.

Each test compiles many ops into one model (one C compiler run) and compares
the generic C build with the reference interpreter at two run-time shapes;
every build must compile without warnings.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import cuvil
from cuvil.ir.parser import parse_graph

OPSET = 20
RNG = np.random.default_rng(7)
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, 1.0]


def make_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: Sequence[str],
               inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """A model whose output types come from ONNX shape inference."""
    g = helper.make_graph(nodes, "g", inputs, [onnx.ValueInfoProto(name=o) for o in outputs], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    vi = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    del m.graph.output[:]
    m.graph.output.extend(vi[o] for o in outputs)
    return m


def compile_c(model: onnx.ModelProto | object, tmp: Path) -> cuvil.CompiledModel:
    m = cuvil.compile(model, target="generic", cache_dir=str(tmp / "cache"))
    assert m.build_info.warnings == ""  # type: ignore[union-attr]
    return m


def tol(dtype: np.dtype) -> dict[str, float]:
    if dtype == np.float16:
        return {"rtol": 2e-3, "atol": 1e-4}
    if dtype == ml_dtypes.bfloat16:
        return {"rtol": 1.6e-2, "atol": 1e-3}
    if dtype == np.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {"rtol": 1e-12, "atol": 0}


def compare(model: onnx.ModelProto | object, feeds: Sequence[Sequence[np.ndarray]], tmp: Path) -> None:
    """The C build and the reference agree (dtype, shape, values) on every feed."""
    c = compile_c(model, tmp)
    ref = cuvil.compile(model, target="ref")
    for xs in feeds:
        got, want = c(*xs), ref(*xs)
        for name, g, w in zip([s.name for s in c.signature.outputs], got, want):  # type: ignore[attr-defined]
            assert g.dtype == w.dtype and g.shape == w.shape, name
            if w.dtype.kind in "f" or w.dtype == ml_dtypes.bfloat16:
                np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), err_msg=name, **tol(w.dtype))
            else:
                np.testing.assert_array_equal(g, w, err_msg=name)


def vi(name: str, elem: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def floats(n: int, cols: int, dtype: type, specials: bool = True) -> np.ndarray:
    x = RNG.standard_normal(n * cols) * 2
    if specials:
        x[: len(SPECIAL)] = SPECIAL[: n * cols]
    return x.reshape(n, cols).astype(dtype)


UNARY = ["Abs", "Neg", "Sign", "Ceil", "Floor", "Round", "Reciprocal", "Sqrt", "Exp", "Log", "Erf", "Sin", "Cos",
         "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Tanh", "Asinh", "Acosh", "Atanh", "Relu", "Sigmoid",
         "HardSwish", "Softplus", "Softsign", "Mish"]
UNARY_ATTRS: list[tuple[str, dict[str, object]]] = [
    ("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 0.5}), ("Celu", {"alpha": 2.0}), ("Selu", {}),
    ("ThresholdedRelu", {"alpha": 0.3}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Shrink", {"bias": 0.5, "lambd": 0.7}),
    ("Gelu", {}), ("Gelu", {"approximate": "tanh"}), ("IsInf", {}), ("IsInf", {"detect_negative": 0}),
    ("IsInf", {"detect_positive": 0}), ("IsNaN", {}),
]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"]


def float_model(elem: int) -> tuple[onnx.ModelProto, list[str]]:
    """Every float op over x: [N, 4], y: [4] and z: [N, 1] (broadcasting) and scalar bounds."""
    nodes, outs = [], []

    def add(op: str, ins: list[str], **attrs: object) -> None:
        out = f"o{len(outs)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        outs.append(out)

    for op in UNARY:
        add(op, ["x"])
    for op, attrs in UNARY_ATTRS:
        add(op, ["x"], **attrs)
    for op in BINARY:
        add(op, ["x", "y"])
        add(op, ["z", "x"])
    add("Mod", ["x", "y"], fmod=1)
    add("Max", ["x", "y", "z"])
    add("Min", ["x", "z"])
    add("Max", ["x"])
    add("Sum", ["x", "y", "z"])
    add("Mean", ["z", "y"])
    add("PRelu", ["x", "y"])
    add("Clip", ["x", "lo", "hi"])
    add("Clip", ["x", "", "hi"])
    add("Clip", ["x", "hi", "lo"])  # min > max: every element is max
    nodes.append(helper.make_node("Less", ["z", "y"], ["c"]))
    add("Where", ["c", "x", "y"])
    add("Where", ["c", "lo", "z"])
    inputs = [vi("x", elem, ["N", 4]), vi("y", elem, [4]), vi("z", elem, ["N", 1]), vi("lo", elem, []),
              vi("hi", elem, [1])]
    return make_model(nodes, inputs, outs), outs


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_float_ops_match_reference(dtype: type, tmp_path: Path) -> None:
    elem = {np.float32: T.FLOAT, np.float64: T.DOUBLE, np.float16: T.FLOAT16}[dtype]
    model, _ = float_model(elem)
    feeds = []
    for n in (1, 5):
        lo, hi = np.array(-0.5, dtype), np.array([1.25], dtype)
        feeds.append([floats(n, 4, dtype), floats(1, 4, dtype, False).reshape(4), floats(n, 1, dtype), lo, hi])
    compare(model, feeds, tmp_path)


def test_bfloat16_ops_match_reference(tmp_path: Path) -> None:
    nodes = [helper.make_node("Cast", [i], [f"{i}b"], to=T.BFLOAT16) for i in ("x", "y")]
    outs = []
    for op in ["Add", "Sub", "Mul", "Div", "Max", "Min", "Less", "Equal"]:
        nodes.append(helper.make_node(op, ["xb", "yb"], [op]))
        outs.append(op)
    for op in ["Relu", "Sigmoid", "Exp", "Sqrt", "Neg", "Abs", "Round", "Floor", "IsNaN"]:
        nodes.append(helper.make_node(op, ["xb"], [op + "1"]))
        outs.append(op + "1")
    nodes.append(helper.make_node("Where", ["Less", "xb", "yb"], ["w"]))
    nodes.append(helper.make_node("Cast", ["xb"], ["back"], to=T.FLOAT))
    outs += ["w", "back"]
    model = make_model(nodes, [vi("x", T.FLOAT, ["N", 4]), vi("y", T.FLOAT, [4])], outs)
    compare(model, [[floats(n, 4, np.float32), floats(1, 4, np.float32, False).reshape(4)] for n in (1, 3)], tmp_path)


INT_TYPES = {np.int8: T.INT8, np.int16: T.INT16, np.int32: T.INT32, np.int64: T.INT64, np.uint8: T.UINT8,
             np.uint16: T.UINT16, np.uint32: T.UINT32, np.uint64: T.UINT64}


@pytest.mark.parametrize("dtype", list(INT_TYPES))
def test_integer_ops_match_reference(dtype: type, tmp_path: Path) -> None:
    """Wrap-around at the type's extremes, truncating division, both remainders, integer powers."""
    elem = INT_TYPES[dtype]
    info = np.iinfo(dtype)
    signed = info.min < 0
    nodes, outs = [], []

    def add(op: str, ins: list[str], **attrs: object) -> None:
        out = f"o{len(outs)}"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        outs.append(out)

    for op in ["Add", "Sub", "Mul", "Div", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual"]:
        add(op, ["x", "y"])
        add(op, ["y", "z"])
    add("Mod", ["x", "y"])
    add("Mod", ["x", "y"], fmod=1)
    add("Mod", ["z", "y"])
    add("Pow", ["x", "e"])
    add("Pow", ["z", "ef"])  # in range: float -> integer conversion of out-of-range values is not NumPy's
    add("Max", ["x", "y", "z"])
    add("Min", ["x", "z"])
    add("Clip", ["x", "lo", "hi"])
    add("Clip", ["x", "lo"])
    add("Abs", ["x"])
    add("Sign", ["x"])
    add("Shrink", ["e"], bias=1.0, lambd=1.5)
    add("PRelu", ["x", "y"])
    add("Where", ["c", "x", "z"])
    if signed:
        add("Neg", ["x"])
        add("Relu", ["x"])
    model = make_model(
        nodes,
        [vi("x", elem, ["N", 4]), vi("y", elem, [4]), vi("z", elem, ["N", 1]), vi("e", elem, ["N", 4]),
         vi("ef", T.FLOAT, [4]), vi("lo", elem, []), vi("hi", elem, []), vi("c", T.BOOL, [4])],
        outs,
    )
    feeds = []
    for n in (1, 3):
        x = RNG.integers(max(info.min, -100), min(info.max, 100), (n, 4), dtype=dtype, endpoint=True)
        x[0, :2] = [info.min, info.max]
        y = np.array([-3 if signed else 3, 7, -1 if signed else 1, 2], dtype)  # no zero divisor: see below
        z = RNG.integers(1, 50, (n, 1), dtype=dtype)
        e = RNG.integers(-2 if signed else 0, 6, (n, 4), dtype=dtype)
        ef = np.array([0.5, 1.0, 0.0, 0.25], np.float32)
        lo, hi = np.array(info.min // 2 + 3, dtype), np.array(60, dtype)
        c = np.array([True, False, True, False])
        feeds.append([x, y, z, e, ef, lo, hi, c])
    compare(model, feeds, tmp_path)


def test_integer_division_by_zero_is_defined(tmp_path: Path) -> None:
    """x / 0 and x mod 0 give 0 (C would trap or be undefined); INT_MIN / -1 wraps."""
    nodes = [helper.make_node("Div", ["x", "y"], ["d"]), helper.make_node("Mod", ["x", "y"], ["m"]),
             helper.make_node("Mod", ["x", "y"], ["f"], fmod=1)]
    model = make_model(nodes, [vi("x", T.INT32, [4]), vi("y", T.INT32, [4])], ["d", "m", "f"])
    c = compile_c(model, tmp_path)
    lo = np.iinfo(np.int32).min
    d, m, f = c(np.array([7, -7, 0, lo], np.int32), np.array([0, 0, 0, -1], np.int32))
    np.testing.assert_array_equal(d, [0, 0, 0, lo])
    np.testing.assert_array_equal(m, [0, 0, 0, 0])
    np.testing.assert_array_equal(f, [0, 0, 0, 0])


def test_logic_ops_match_reference(tmp_path: Path) -> None:
    nodes, outs = [], []
    for i, (op, ins) in enumerate([("And", ["a", "b"]), ("Or", ["a", "b"]), ("Xor", ["b", "a"]), ("Not", ["a"]),
                                   ("Equal", ["a", "b"]), ("Where", ["a", "h", "k"]), ("Where", ["b", "k", "h"])]):
        nodes.append(helper.make_node(op, ins, [f"o{i}"]))
        outs.append(f"o{i}")
    model = make_model(nodes, [vi("a", T.BOOL, ["N", 3]), vi("b", T.BOOL, [3]), vi("h", T.FLOAT16, ["N", 1]),
                               vi("k", T.FLOAT16, [1, 3])], outs)
    feeds = []
    for n in (1, 4):
        h = np.array([np.nan, 1, -2, 3e-7][:n], np.float16).reshape(n, 1)
        feeds.append([RNG.random((n, 3)) > 0.5, np.array([True, False, True]), h, np.array([[0.1, -0.0, 65504]], np.float16)])
    compare(model, feeds, tmp_path)


ALL_TYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16,
             T.BOOL: np.bool_, **{v: k for k, v in INT_TYPES.items()}}


def test_cast_every_pair_matches_reference(tmp_path: Path) -> None:
    nodes, outs, inputs = [], [], []
    for src in ALL_TYPES:
        inputs.append(vi(f"x{src}", src, ["N"]))
        for dst in ALL_TYPES:
            nodes.append(helper.make_node("Cast", [f"x{src}"], [f"c{src}_{dst}"], to=dst))
            outs.append(f"c{src}_{dst}")
    model = make_model(nodes, inputs, outs)
    values = np.array([0, 1, 2.5, 3.75, 100, 7, 0.25, 100.9])
    feeds = [[values[:n].astype(t) for t in ALL_TYPES.values()] for n in (3, 8)]
    compare(model, feeds, tmp_path)


def test_cast_float_special_values(tmp_path: Path) -> None:
    """NaN, infinities, overflow to inf, half subnormals, and float64 -> float16 rounded once."""
    targets = [T.FLOAT16, T.BFLOAT16, T.FLOAT, T.DOUBLE, T.BOOL]
    nodes = [helper.make_node("Cast", [x], [f"{x}{t}"], to=t) for x in ("f", "d") for t in targets]
    model = make_model(nodes, [vi("f", T.FLOAT, ["N"]), vi("d", T.DOUBLE, ["N"])],
                       [f"{x}{t}" for x in ("f", "d") for t in targets])
    vals = [np.nan, np.inf, -np.inf, 65520.0, 65519.0, 1e-8, -3e-5, 1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30, 0.0]
    compare(model, [[np.array(vals, np.float32), np.array(vals, np.float64)]], tmp_path)
    c = compile_c(model, tmp_path)
    out = dict(zip([s.name for s in c.signature.outputs], c(np.zeros(1, np.float32), np.array([1 + 2**-11 + 2**-40]))))  # type: ignore[attr-defined]
    assert out[f"d{T.FLOAT16}"][0] == np.float16(1 + 2**-10)  # through float32 it would round to 1


def test_cast_float_to_int_saturates(tmp_path: Path) -> None:
    """Out-of-range values saturate and NaN gives 0 (ONNX leaves them undefined; C makes them UB)."""
    targets = {T.INT8: np.int8, T.INT32: np.int32, T.INT64: np.int64, T.UINT8: np.uint8, T.UINT64: np.uint64}
    nodes = [helper.make_node("Cast", ["x"], [f"c{t}"], to=t) for t in targets]
    model = make_model(nodes, [vi("x", T.DOUBLE, [7])], [f"c{t}" for t in targets])
    c = compile_c(model, tmp_path)
    x = np.array([np.nan, 1e30, -1e30, -3.0, 300.7, -0.9, np.inf])
    got = dict(zip(targets, c(x)))
    for t, dt in targets.items():
        i = np.iinfo(dt)
        want = [0, i.max, i.min, max(-3, i.min), min(300, i.max), 0, i.max]
        np.testing.assert_array_equal(got[t], np.array(want, dt), err_msg=str(dt))


def test_full_like_every_type(tmp_path: Path) -> None:
    values = {"f16": "-1.5", "bf16": "3.0", "f32": "0.1", "f64": "0.1", "i8": "-7", "u64": "18446744073709551615",
              "i64": "-9223372036854775808", "bool": "true", "u8": "255"}
    body = "\n".join(f"  %{t} = full_like(%x) {{value = dense<{t}[]> [{v}]}} : {t}[N, 2]" for t, v in values.items())
    graph = parse_graph(f"graph g(%x: f32[N, 2]) {{\n  symbol N\n{body}\n  return {', '.join('%' + t for t in values)}\n}}\n")
    compare(graph, [[np.zeros((n, 2), np.float32)] for n in (0, 3)], tmp_path)


def test_broadcast_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("PRelu", ["x", "p"], ["r"])]
    model = make_model(nodes, [vi("x", T.FLOAT, ["N", "C"]), vi("y", T.FLOAT, ["M", 1]), vi("p", T.FLOAT, ["P"])],
                       ["s", "r"])
    c = compile_c(model, tmp_path)
    s, r = c(np.ones((2, 3), np.float32), np.ones((1, 1), np.float32), np.full(3, 0.5, np.float32))
    assert s.shape == (2, 3) and r.shape == (2, 3)
    with pytest.raises(cuvil.CuvilError, match=r"output axis 0 do not broadcast: 2 vs 3 \(N = 2, M = 3\)"):
        c(np.ones((2, 3), np.float32), np.ones((3, 1), np.float32), np.ones(3, np.float32))
    with pytest.raises(cuvil.CuvilError, match="do not broadcast"):
        c(np.ones((2, 3), np.float32), np.ones((1, 1), np.float32), np.ones(4, np.float32))


@pytest.mark.parametrize("target", ["generic", "native"])
def test_relu_and_clip_with_constant_bounds_keep_nan_and_signed_zeros(target: str, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Constant bounds take the shorter NaN test (the bound cannot be NaN): a NaN input still comes
    through, and an input equal to a bound (-0.0 against 0.0 included) gives the bound, bit for bit
    as the reference, in the clip kernel, a fused elementwise loop and a matmul's tile epilogue."""
    lo = numpy_helper.from_array(np.array(0.0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6.0, np.float32), "hi")
    one = numpy_helper.from_array(np.ones((1, 16), np.float32), "one")  # K = 1: the products are exact
    two = numpy_helper.from_array(np.full((1, 16), 2.0, np.float32), "two")
    nodes = [helper.make_node("Clip", ["x", "lo", "hi"], ["clip"]),
             helper.make_node("Relu", ["x"], ["relu"]),
             helper.make_node("Neg", ["x"], ["negated"]),
             helper.make_node("Clip", ["negated", "lo", "hi"], ["fused"]),
             helper.make_node("MatMul", ["x", "one"], ["prod"]),
             helper.make_node("Clip", ["prod", "lo", "hi"], ["epilogue"]),
             helper.make_node("MatMul", ["x", "two"], ["prod2"]),
             helper.make_node("Relu", ["prod2"], ["epilogue_relu"])]
    outs = ["clip", "relu", "fused", "epilogue", "epilogue_relu"]
    model = make_model(nodes, [vi("x", T.FLOAT, [40, 1])], outs, [lo, hi, one, two])
    special = [np.nan, -np.nan, -0.0, 0.0, 6.0, -6.0, np.inf, -np.inf, 6.0000005, -1e-45, 1e-45, 3.0]
    x = np.concatenate([special, RNG.standard_normal(28) * 8]).astype(np.float32).reshape(40, 1)
    with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
        m = cuvil.compile(model, target=target, cache_dir=str(tmp_path / "cache"))
    assert "epilogue on each finished tile of the matmul product: clip" in caplog.text
    assert "epilogue on each finished tile of the matmul product: relu" in caplog.text
    assert "fused elementwise loop: neg, clip" in caplog.text
    assert m.build_info is not None
    source = m.build_info.source.read_text()
    assert "cuvil_max_f(" not in source and "cuvil_min_f(" not in source  # every path took the shorter test
    assert "cuvil_max_nn_f(" in source and "cuvil_min_nn_f(" in source
    got, want = m(x), cuvil.compile(model, target="ref")(x)
    for name, g, w in zip(outs, got, want):
        assert np.array_equal(g.view(np.uint32), w.view(np.uint32)), name
    assert np.isnan(got[0][:2]).all() and np.signbit(got[0][2]) == np.signbit(want[0][2])

"""The low-bit storage types (int4, uint4, int2, uint2, float8, float4): conversions against an
exact oracle and ml_dtypes on the reference and the C targets, quantization against ONNX's
reference, the zero-point rule, and the refusal of every op that computes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

import cuvil
import cuvil.ops
from cuvil.backends.c.library import RunError
from cuvil.errors import CuvilError, StorageTypeError, UnsupportedOpError
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import ALL, LOWBIT, LOWBIT_FLOATS, LOWBIT_INTS, DType
from cuvil.ir.graph import Value
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ops.common import infer_types
from cuvil.ops.registry import STORAGE_TYPES

C_TARGETS = ["native", "generic"]
TARGETS = ["ref", *C_TARGETS]
try:
    import wasmtime  # noqa: F401
    import ziglang  # noqa: F401

    _WASM = True
except ImportError:
    _WASM = False
# the exhaustive conversion tests also run on wasm32 (the same C, compiled by zig cc for wasm32)
ALL_TARGETS = [*TARGETS, pytest.param("wasm32", marks=pytest.mark.skipif(not _WASM, reason="no wasmtime/zig"))]
FLOAT_TYPES = sorted(LOWBIT_FLOATS, key=str)
INT_TYPES = sorted(LOWBIT_INTS, key=str)
# largest finite code, and what a format has besides finite numbers
_FORMAT = {DType.f8e4m3fn: (0x7E, "fn"), DType.f8e4m3fnuz: (0x7F, "fnuz"), DType.f8e5m2: (0x7B, "ieee"),
           DType.f8e5m2fnuz: (0x7F, "fnuz"), DType.f4e2m1: (0x7, "none")}


def _compile(graph: object, target: str, tmp_path: object, request: pytest.FixtureRequest | None = None) -> cuvil.CompiledModel:
    if target == "ref":
        return cuvil.compile(graph, "ref")
    if target == "wasm32":
        assert request is not None
        return cuvil.compile(graph, target, cache_dir=request.getfixturevalue("wasm_cache"))
    return cuvil.compile(graph, target, cache_dir=str(tmp_path))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


def _nbits(dt: DType) -> int:
    return 4 if dt is DType.f4e2m1 else 8


# the oracle -----------------------------------------------------------------------------------


def _values(dt: DType) -> tuple[np.ndarray, np.ndarray]:
    """The non-negative finite codes of ``dt`` and their values, from ml_dtypes, in increasing order;
    then one code past the largest (its would-be value: a tie rounding there overflows)."""
    max_code, _ = _FORMAT[dt]
    codes = np.arange(max_code + 1, dtype=np.uint8)
    vals = codes.view(dt.np).astype(np.float64)
    step = vals[-1] - vals[-2] if dt is not DType.f4e2m1 else 2.0  # 6 -> 8 continues the binade's spacing
    return np.append(codes.astype(np.int64), max_code + 1), np.append(vals, vals[-1] + step)


def _oracle(x: float, dt: DType, saturate: bool) -> int:
    """The code of float32 ``x`` by the rules of cuvil/ops/lowbit.py, found by search (not bit tricks)."""
    max_code, kind = _FORMAT[dt]
    sbit = 1 << (_nbits(dt) - 1)
    neg = bool(np.signbit(x))
    if np.isnan(x):
        return {"fn": (sbit if neg else 0) | 0x7F, "fnuz": 0x80, "ieee": (sbit if neg else 0) | 0x7E, "none": 0}[kind]
    codes, vals = _values(dt)
    a = abs(float(x))
    if np.isinf(x):
        code = max_code + 1
    else:
        i = int(np.searchsorted(vals, a))  # vals[i-1] < a <= vals[i]
        if i < len(vals) and vals[i] == a:
            code = int(codes[i])
        elif i >= len(vals):
            code = max_code + 1
        else:
            lo, hi = vals[i - 1], vals[i]
            pick_hi = a - lo > hi - a or (a - lo == hi - a and codes[i] % 2 == 0)
            code = int(codes[i] if pick_hi else codes[i - 1])
    if code > max_code:
        if saturate or kind == "none":
            code = max_code
        elif kind == "ieee":
            code = max_code + 1
        else:
            return 0x80 if kind == "fnuz" else (sbit if neg else 0) | 0x7F
    if kind == "fnuz" and code == 0:
        return 0
    return (sbit if neg else 0) | code


def _probe_values(dt: DType) -> np.ndarray:
    """Every finite value of ``dt``, the midpoints between neighbours (ties) and the float32 values
    next to them, the boundary beyond the largest value, specials, and random float32 values."""
    _, vals = _values(dt)
    mids = (vals[:-1] + vals[1:]) / 2
    f = np.concatenate([vals, mids, vals[-1] * np.array([1.01, 2.0, 1e6])]).astype(np.float32)
    near = np.concatenate([np.nextafter(f, np.float32(np.inf)), np.nextafter(f, np.float32(0))])
    rng = np.random.default_rng(int(dt.itemsize) + len(str(dt)))
    rand = (rng.standard_normal(2000) * np.exp2(rng.integers(-20, 20, 2000))).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 1e-45, 3e38, np.float32(vals[1]) / 2, 2.0**-30], np.float32)
    allv = np.concatenate([f, near, rand, special])
    neg_nan = np.array([0xFFC00000, 0x7F800001], np.uint32).view(np.float32)  # -NaN, a signalling NaN
    return np.concatenate([allv, -allv, np.array([0.0, -0.0], np.float32), neg_nan])


def test_oracle_agrees_with_ml_dtypes() -> None:
    """ml_dtypes (ONNX's reference) rounds to nearest even: the oracle is checked against it where
    the two define the same thing (float4's NaN aside, which ml_dtypes turns into a zero of the
    opposite sign)."""
    for dt in FLOAT_TYPES:
        x = _probe_values(dt)
        x = x[~np.isnan(x)] if dt is DType.f4e2m1 else x
        want = np.array([_oracle(v, dt, saturate=False) for v in x], np.uint8)
        with np.errstate(all="ignore"):
            got = _bits(x.astype(dt.np))
        assert np.array_equal(got, want), (dt, x[got != want][:5])


# conversions on every target --------------------------------------------------------------------


def _decode_graph() -> tuple[object, dict[str, np.ndarray]]:
    """Every code of each low-bit type, cast to float32 (floats) or int32 (integers)."""
    b = Builder()
    inputs = {}
    for dt in LOWBIT:
        name = f"x_{dt}"
        n = 1 << (8 if dt in FLOAT_TYPES and dt is not DType.f4e2m1 else 4 if "4" in str(dt) else 2)
        x = b.input(name, TensorType(dt, (n,)))
        inputs[name] = np.arange(n, dtype=np.uint8).view(dt.np)
        b.output(b.add1("cast", [x], {"to": DType.f32 if dt in LOWBIT_FLOATS else DType.i32}))
    return b.graph, inputs


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_every_code_decodes_as_ml_dtypes_does(target: str, tmp_path: object, request: pytest.FixtureRequest) -> None:
    graph, inputs = _decode_graph()
    got = _compile(graph, target, tmp_path, request).run(inputs)
    for x, y in zip(inputs.values(), got.values()):
        dt = DType.from_np(x.dtype)
        want = x.astype(np.float32 if dt in LOWBIT_FLOATS else np.int32)
        assert y.dtype == want.dtype and np.array_equal(_bits(y), _bits(want)), (target, dt)


def _encode_graph(dt_in: DType = DType.f32) -> object:
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n", min=1)
    x = b.input("x", TensorType(dt_in, (sym("n"),)))
    for dt in FLOAT_TYPES:
        for sat in (1, 0):
            b.output(b.add1("cast", [x], {"to": dt, "saturate": sat}))
    return b.graph


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_float32_encodes_by_the_oracle(target: str, tmp_path: object, request: pytest.FixtureRequest) -> None:
    """Round to nearest even at every tie, subnormals, the largest value and beyond, NaN and
    infinities, with and without saturation, bit for bit."""
    m = _compile(_encode_graph(), target, tmp_path, request)
    for i, dt in enumerate(FLOAT_TYPES):
        x = _probe_values(dt)
        outs = m.run({"x": x})
        for j, sat in enumerate((True, False)):
            got = _bits(list(outs.values())[2 * i + j])
            want = np.array([_oracle(v, dt, sat) for v in x], np.uint8)
            bad = got != want
            assert not bad.any(), (target, dt, sat, x[bad][:5], got[bad][:5], want[bad][:5])


@pytest.mark.parametrize("target", TARGETS)
def test_float64_and_float16_round_through_float32(target: str, tmp_path: object) -> None:
    """A double is rounded to float32 first, as ml_dtypes converts: 1 + 2^-4 + 2^-40 becomes the tie
    1.0625, which rounds to even (1.0) in e4m3fn, not up to 1.125."""
    m = _compile(_encode_graph(DType.f64), target, tmp_path)
    x = np.array([1.0 + 2.0**-4 + 2.0**-40, 447.9999999, 1e300, -1e-300], np.float64)
    got = _bits(m.run({"x": x})[m.output_names[2 * FLOAT_TYPES.index(DType.f8e4m3fn)]])  # saturating
    assert got.tolist() == [0x38, 0x7E, 0x7E, 0x80]
    h = _compile(_encode_graph(DType.f16), target, tmp_path)
    xh = np.array([65504, -3.5, 0.0009765625], np.float16)
    for k, v in h.run({"x": xh}).items():
        dt = FLOAT_TYPES[h.output_names.index(k) // 2]
        sat = h.output_names.index(k) % 2 == 0
        assert _bits(v).tolist() == [_oracle(float(e), dt, sat) for e in xh.astype(np.float32)], (k, dt)


@pytest.mark.parametrize("target", TARGETS)
def test_integers_wrap_and_floats_truncate_into_4_and_2_bits(target: str, tmp_path: object) -> None:
    b = Builder()
    xf = b.input("xf", TensorType(DType.f32, (12,)))
    xi = b.input("xi", TensorType(DType.i64, (6,)))
    for dt in INT_TYPES:
        b.output(b.add1("cast", [xf, ], {"to": dt}), b.add1("cast", [xi], {"to": dt}))
    i4 = b.add1("cast", [xi], {"to": DType.i4})
    b.output(*(b.add1("cast", [i4], {"to": t}) for t in (DType.u8, DType.i64, DType.f16, DType.f8e5m2)))
    xf_v = np.array([-9, 8, 15.5, -0.5, 2.9, -2.9, 2.0**31, -(2.0**31), np.nan, np.inf, 1e10, 2147483520.0],
                    np.float32)
    xi_v = np.array([-9, 8, 300, -1, 2**40 + 5, -(2**40) - 3], np.int64)
    got = list(_compile(b.graph, target, tmp_path).run({"xf": xf_v, "xi": xi_v}).values())

    def wrap(v: int, bits: int, signed: bool) -> int:
        v &= (1 << bits) - 1
        return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v

    for k, dt in enumerate(INT_TYPES):
        bits, signed = (4 if "4" in str(dt) else 2), str(dt).startswith("i")
        tf = [0 if not abs(v) < 2.0**31 else int(np.trunc(v)) for v in xf_v.astype(np.float64)]
        assert got[2 * k].dtype == dt.np
        assert got[2 * k].astype(np.int64).tolist() == [wrap(v, bits, signed) for v in tf], (target, dt)
        assert got[2 * k + 1].astype(np.int64).tolist() == [wrap(int(v), bits, signed) for v in xi_v], (target, dt)
    as_i4 = [wrap(int(v), 4, True) for v in xi_v]
    assert got[-4].tolist() == [v & 0xFF for v in as_i4]  # int4 -> uint8 wraps
    assert got[-3].tolist() == as_i4
    assert got[-2].astype(np.float64).tolist() == as_i4
    assert got[-1].astype(np.float64).tolist() == as_i4


def _pairs_graph() -> tuple[object, dict[str, np.ndarray]]:
    """A cast for every pair of types with a low-bit side; sources hold small values exact in
    float4 (negative ones left out where a float goes to an unsigned type: undefined in ONNX)."""
    base = np.array([0, 1, -1, 2, -2, 3, -3, 0.5, 1.5, 4, 6, -0.5, -0.0], np.float32)
    b = Builder()
    inputs = {}
    for src in sorted(ALL | LOWBIT, key=str):
        for sign in ("", "nonneg"):
            vals = np.abs(base) if sign else base
            name = f"{src}{sign}"
            inputs[name] = vals.astype(np.float64).astype(np.int64).astype(src.np) if src.is_int else vals.astype(src.np)
            x = b.input(name, TensorType(src, (len(base),)))
            for dst in sorted(ALL | LOWBIT, key=str):
                float_src = src.is_float or src in LOWBIT_FLOATS
                unsigned = dst.is_int and not dst.is_signed
                if (src in LOWBIT or dst in LOWBIT) and bool(sign) == (float_src and unsigned):
                    b.output(b.add1("cast", [x], {"to": dst}))
    return b.graph, inputs


@pytest.mark.parametrize("target", C_TARGETS)
def test_every_pair_with_a_low_bit_side_matches_the_reference(target: str, tmp_path: object) -> None:
    graph, inputs = _pairs_graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    got = _compile(graph, target, tmp_path).run(inputs)
    assert len(want) > 300
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(_bits(got[name]), _bits(w)), name


# quantization against ONNX's reference ----------------------------------------------------------

_ONNX_ELEM = {DType.i4: TensorProto.INT4, DType.u4: TensorProto.UINT4, DType.i2: TensorProto.INT2,
              DType.u2: TensorProto.UINT2, DType.f8e4m3fn: TensorProto.FLOAT8E4M3FN,
              DType.f8e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ, DType.f8e5m2: TensorProto.FLOAT8E5M2,
              DType.f8e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ, DType.f4e2m1: TensorProto.FLOAT4E2M1}


def _qmodel(node: onnx.NodeProto, inputs: dict[str, np.ndarray], out_elem: int) -> onnx.ModelProto:
    vis = [oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g = oh.make_graph([node], "q", vis, [oh.make_tensor_value_info("y", out_elem, None)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 25)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", INT_TYPES)
def test_quantize_to_4_and_2_bits_saturates_and_rounds_half_to_even(dt: DType, target: str, tmp_path: object) -> None:
    lo, hi = {"i4": (-8, 7), "u4": (0, 15), "i2": (-2, 1), "u2": (0, 3)}[str(dt)]
    x = (np.arange(-40, 41, dtype=np.float32) * 0.25).reshape(3, 27)  # ties at every odd multiple of 0.25 / 0.5
    scale = np.array([0.5, 0.25, 1.0], np.float32)
    zp = np.array([lo, (lo + hi) // 2, hi], np.int64).astype(dt.np)
    ins = {"x": x, "s": scale, "z": zp}
    q = _qmodel(oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=0), ins, _ONNX_ELEM[dt])
    want = ReferenceEvaluator(q).run(None, ins)[0]
    got = _compile(load_onnx(q), target, tmp_path).run(ins)["y"]
    assert got.dtype == want.dtype == dt.np
    assert np.array_equal(got.astype(np.int64), want.astype(np.int64))
    assert got.astype(np.int64).min() == lo and got.astype(np.int64).max() == hi  # saturated both ways
    dins = {"x": want, "s": scale, "z": zp}
    dq = _qmodel(oh.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=0), dins, TensorProto.FLOAT)
    dgot = _compile(load_onnx(dq), target, tmp_path).run(dins)["y"]
    assert np.array_equal(dgot, ReferenceEvaluator(dq).run(None, dins)[0])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("saturate", [1, 0])
def test_quantize_to_float8_and_float4_matches_onnx(saturate: int, target: str, tmp_path: object) -> None:
    x = np.concatenate([_probe_values(DType.f8e4m3fn)[:400], [1e6, -1e6, np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)
    for dt in FLOAT_TYPES:
        ins = {"x": x, "s": np.float32(0.5), "z": np.zeros((), dt.np)}
        node = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], saturate=saturate)
        q = _qmodel(node, ins, _ONNX_ELEM[dt])
        want = ReferenceEvaluator(q).run(None, ins)[0]
        got = _compile(load_onnx(q), target, tmp_path).run(ins)["y"]
        assert got.dtype == want.dtype
        if dt is DType.f4e2m1:  # ONNX adds the zero point (+0) to -0: compared as values
            assert np.array_equal(got.astype(np.float32), want.astype(np.float32)), target
        else:
            assert np.array_equal(_bits(got), _bits(want)), (target, dt, x[_bits(got) != _bits(want)][:5])
        dins = {"x": got, "s": np.float32(3.0), "z": np.zeros((), dt.np)}
        dq = _qmodel(oh.make_node("DequantizeLinear", ["x", "s", "z"], ["y"]), dins, TensorProto.FLOAT)
        dgot = _compile(load_onnx(dq), target, tmp_path).run(dins)["y"]
        np.testing.assert_array_equal(dgot, ReferenceEvaluator(dq).run(None, dins)[0])


def test_float8_zero_point_must_be_zero(tmp_path: object) -> None:
    x = np.ones(3, np.float32)
    z = np.array([0.5], ml_dtypes.float8_e4m3fn)
    const = _qmodel(oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), {"x": x, "s": np.float32(1)},
                    TensorProto.FLOAT8E4M3FN)
    const.graph.initializer.append(onnx.numpy_helper.from_array(z, "z"))
    with pytest.raises(CuvilError, match="zero point of a f8e4m3fn quantization must be 0"):
        load_onnx(const)
    ins = {"x": x, "s": np.float32(1), "z": z}
    run_time = load_onnx(_qmodel(oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"]), ins, TensorProto.FLOAT8E4M3FN))
    with pytest.raises(CuvilError, match="must be 0"):
        cuvil.compile(run_time, "ref").run(ins)
    with pytest.raises(RunError, match="must be 0"):
        cuvil.compile(run_time, "native", cache_dir=str(tmp_path)).run(ins)
    ok = {"x": x, "s": np.float32(1), "z": np.array([-0.0], ml_dtypes.float8_e4m3fn)}  # -0 is zero
    assert cuvil.compile(run_time, "native", cache_dir=str(tmp_path)).run(ok)["y"].astype(np.float32).tolist() == [1] * 3


# storage only ----------------------------------------------------------------------------------


@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT4E2M1])
def test_arithmetic_on_a_low_bit_type_is_refused_by_name(elem: int) -> None:
    vi = [oh.make_tensor_value_info(n, elem, [4]) for n in ("a", "b", "y")]
    m = oh.make_model(oh.make_graph([oh.make_node("Add", ["a", "b"], ["y"])], "g", vi[:2], vi[2:]),
                      opset_imports=[oh.make_opsetid("", 21)])
    name = {TensorProto.INT4: "i4", TensorProto.FLOAT8E4M3FN: "f8e4m3fn", TensorProto.FLOAT4E2M1: "f4e2m1"}[elem]
    with pytest.raises(UnsupportedOpError, match=f"add: input 0 has element type {name}, a low-bit storage type"):
        load_onnx(m)


def test_no_op_without_the_trait_takes_a_low_bit_input() -> None:
    """Every registered op that does not declare STORAGE_TYPES refuses a low-bit operand, before its
    own checks could take it for an integer or a float."""
    checked = 0
    for name, opdef in cuvil.ops.all_ops().items():
        lo, _ = opdef.input_arity()
        if STORAGE_TYPES in opdef.traits or lo == 0:
            continue
        for dt in (DType.i4, DType.f8e5m2):
            ins = [Value(f"v{i}", TensorType(dt, (2, 2))) for i in range(lo)]
            with pytest.raises(StorageTypeError, match=str(dt)):
                infer_types(name, ins, {}, max(1, opdef.output_arity()[0]))
        checked += 1
    assert checked > 100


def test_data_movement_takes_low_bit_types_and_transpose_does_not(tmp_path: object) -> None:
    x = np.arange(-8, 8, dtype=np.int64).astype(ml_dtypes.int4).reshape(4, 4)
    vi = oh.make_tensor_value_info("x", TensorProto.INT4, [4, 4])
    shape = onnx.numpy_helper.from_array(np.array([2, 8], np.int64), "shape")
    nodes = [oh.make_node("Reshape", ["x", "shape"], ["r"]), oh.make_node("Identity", ["r"], ["y"])]
    g = oh.make_graph(nodes, "g", [vi], [oh.make_tensor_value_info("y", TensorProto.INT4, None)], [shape])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])
    for target in TARGETS:
        y = _compile(m, target, tmp_path)(x)[0]
        assert y.dtype == x.dtype and np.array_equal(_bits(y), _bits(x.reshape(2, 8))), target
    t = oh.make_graph([oh.make_node("Transpose", ["x"], ["y"])], "g", [vi],
                      [oh.make_tensor_value_info("y", TensorProto.INT4, None)])
    with pytest.raises(UnsupportedOpError, match="transpose: input 0 has element type i4"):
        load_onnx(oh.make_model(t, opset_imports=[oh.make_opsetid("", 21)]))


def test_text_ir_round_trips_low_bit_constants_and_saturate() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (3,)))
    w = b.constant(np.array([1.5, -0.25, 448], ml_dtypes.float8_e4m3fn))
    zp = b.constant(np.array(-3, ml_dtypes.int4))
    q = b.add1("quantize_linear", [x, b.constant(np.float32(0.5)), zp])
    b.output(b.add1("cast", [x], {"to": DType.f8e5m2, "saturate": 0}), b.add1("dequantize_linear", [w, b.constant(np.float32(2))]), q)
    text = print_graph(b.graph)
    assert "dense<f8e4m3fn[3]> [1.5, -0.25, 448.0]" in text and "dense<i4[]> [-3]" in text and "saturate = 0" in text
    again = parse_graph(text)
    assert print_graph(again) == text
    xs = {"x": np.array([1e5, -0.3, 2.0], np.float32)}
    for a, e in zip(cuvil.compile(again, "ref").run(xs).values(), cuvil.compile(b.graph, "ref").run(xs).values()):
        assert a.dtype == e.dtype and np.array_equal(_bits(a), _bits(e))

"""The quantization ops: reference semantics against ONNX's reference implementation, and the
C kernels (every x86 target) bit for bit against Cuvil's reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.errors import CuvilError, UnsupportedOpError
from cuvil.frontends.onnx import load_onnx
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from tests.support.targets import runnable

_ELEM = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8, np.int16: TensorProto.INT16, np.uint16: TensorProto.UINT16}


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], out_elem: int, opset: int = 25) -> onnx.ModelProto:
    vis = [oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in inputs.items()]
    g = oh.make_graph([node], "q", vis, [oh.make_tensor_value_info("y", out_elem, None)])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _cuvil_ref(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    return cuvil.compile(load_onnx(model), "ref").run(inputs)["y"]


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Values with exact half-way ties after division by 0.5, and some far out of range."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-600, 600, shape).astype(np.float32) * 0.25
    x.reshape(-1)[:3] = [1e9, -1e9, 0.75]
    return x


GRANULARITY = {
    "tensor": ((), {}),
    "axis": ((3,), {"axis": 1}),
    "blocked": ((2, 2, 5), {"axis": 1, "block_size": 2}),  # X [2, 3, 5]: ceil(3 / 2) = 2 blocks
}


@pytest.mark.parametrize("gran", list(GRANULARITY))
@pytest.mark.parametrize("qtype", [np.uint8, np.int8, np.int16, np.uint16])
def test_quantize_and_dequantize_match_onnx_reference(qtype: type, gran: str) -> None:
    pshape, attrs = GRANULARITY[gran]
    rng = np.random.default_rng(1)
    x = _x((2, 3, 5), 0)
    scale = np.full(pshape, 0.5, np.float32) * rng.choice([1.0, 2.0], pshape).astype(np.float32)
    info = np.iinfo(qtype)
    zp = rng.integers(info.min // 4, info.max // 4 + 1, pshape).astype(qtype)
    ins = {"x": x, "s": scale, "z": zp}
    q = _model(oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs), ins, _ELEM[qtype])
    want = ReferenceEvaluator(q).run(None, ins)[0]
    got = _cuvil_ref(q, ins)
    assert got.dtype == want.dtype and np.array_equal(got, want)  # exact: rounding half to even, saturation
    ins2 = {"x": want, "s": scale, "z": zp}
    dq = _model(oh.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs), ins2, TensorProto.FLOAT)
    want2 = ReferenceEvaluator(dq).run(None, ins2)[0]
    got2 = _cuvil_ref(dq, ins2)
    assert got2.dtype == np.float32 and np.array_equal(got2, want2)


def test_quantize_nan_gives_the_zero_point_and_default_type_is_uint8() -> None:
    ins = {"x": np.array([np.nan, 1.0, -np.inf, np.inf], np.float32), "s": np.float32(0.5)}
    m = _model(oh.make_node("QuantizeLinear", ["x", "s"], ["y"]), ins, TensorProto.UINT8)
    assert _cuvil_ref(m, ins).tolist() == [0, 2, 0, 255]


def test_unsupported_types_and_bad_shapes_are_refused() -> None:
    ins = {"x": np.array([-20, 2.5, 3.5, 20], np.float32), "s": np.float32(1)}
    int4 = _model(oh.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.INT4), ins, TensorProto.INT4)
    assert _cuvil_ref(int4, ins).astype(np.int32).tolist() == [-8, 2, 4, 7]  # int4 is a quantized type now
    e8m0 = _model(oh.make_node("QuantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.FLOAT8E8M0), ins,
                  TensorProto.FLOAT8E8M0)
    with pytest.raises(UnsupportedOpError, match="FLOAT8E8M0"):
        load_onnx(e8m0)
    ins = {"x": np.zeros((2, 3), np.float32), "s": np.ones(4, np.float32)}
    bad = _model(oh.make_node("QuantizeLinear", ["x", "s"], ["y"]), ins, TensorProto.UINT8)
    with pytest.raises(CuvilError, match="per-axis scale has 4 elements"):
        load_onnx(bad)
    v10 = _model(oh.make_node("QuantizeLinear", ["x", "s"], ["y"]), {"x": np.zeros((2, 3), np.float32),
                                                                     "s": np.ones(3, np.float32)}, TensorProto.UINT8, 10)
    with pytest.raises(CuvilError, match="per-tensor"):
        load_onnx(v10)


def _graph() -> tuple[object, dict[str, np.ndarray]]:
    """One graph using every quantization op and both signednesses, with constant (packed-once)
    and run-time operands, shapes that leave partial register tiles, and K not a multiple of 4."""
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (37, 70)))
    img = b.input("img", TensorType(DType.u8, (2, 6, 9, 11)))
    bi8 = b.input("bi8", TensorType(DType.i8, (70, 45)))
    c = b.constant

    def f32(v: object) -> object:
        return c(np.asarray(v, np.float32))

    outs = []
    # quantize per column (axis 1) to int8, dequantize blocked
    scol = f32(rng.uniform(0.01, 0.05, 70))
    xq = b.add1("quantize_linear", [x, scol, c(rng.integers(-5, 5, 70).astype(np.int8))], {"axis": 1})
    xu = b.add1("quantize_linear", [x, f32(0.03), c(np.uint8(120))])
    blk = f32(rng.uniform(0.01, 0.05, (37, 9)))
    outs.append(b.add1("dequantize_linear", [xq, blk, c(np.zeros((37, 9), np.int8))], {"axis": 1, "block_size": 8}))
    # u8 x constant i8, per-column weight scale and zero point, bias, relu
    w = c(rng.integers(-128, 128, (70, 45)).astype(np.int8))
    outs.append(b.add1("qlinear_matmul", [xu, f32(0.03), c(np.uint8(120)), w, f32(rng.uniform(0.001, 0.01, 45)),
                                          c(rng.integers(-3, 3, 45).astype(np.int8)), f32(0.2), c(np.uint8(90)),
                                          c(rng.integers(-2000, 2000, 45).astype(np.int32))], {"relu": 1}))
    # i8 x run-time i8 (both signed), to int8
    xs8 = b.add1("quantize_linear", [x, f32(0.02), c(np.int8(3))])
    outs.append(b.add1("qlinear_matmul", [xs8, f32(0.02), c(np.int8(3)), bi8, f32(0.004), c(np.int8(-2)), f32(0.3),
                                          c(np.int8(-7))]))
    outs.append(b.add1("matmul_integer", [xu, c(rng.integers(0, 256, (70, 33)).astype(np.uint8)), c(np.uint8(120)),
                                          c(rng.integers(0, 256, 33).astype(np.uint8))]))
    # convolutions: per-channel, strided and padded; grouped and dilated
    wc = c(rng.integers(-128, 128, (10, 6, 3, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [img, f32(0.02), c(np.uint8(100)), wc, f32(rng.uniform(0.001, 0.01, 10)),
                                        c(np.zeros(10, np.int8)), f32(0.1), c(np.uint8(128)),
                                        c(rng.integers(-500, 500, 10).astype(np.int32))],
                       {"strides": [2, 1], "pads": [1, 1, 1, 1]}))
    outs.append(b.add1("conv_integer", [img, c(rng.integers(0, 256, (4, 3, 2, 2)).astype(np.uint8)), c(np.uint8(7)),
                                        c(rng.integers(0, 256, 4).astype(np.uint8))], {"group": 2, "dilations": [2, 1]}))
    # depthwise (the direct kernel): int8 with uint8 per-channel-zero-point weights, bias, relu,
    # strided with uneven pads; uint8 with a channel multiplier of 2, dilated; int32 output
    img8 = b.input("img8", TensorType(DType.i8, (2, 5, 8, 7)))
    wd = c(rng.integers(0, 256, (5, 1, 3, 3)).astype(np.uint8))
    outs.append(b.add1("qlinear_conv", [img8, f32(0.05), c(np.int8(-4)), wd, f32(rng.uniform(0.001, 0.01, 5)),
                                        c(rng.integers(100, 150, 5).astype(np.uint8)), f32(0.07), c(np.int8(10)),
                                        c(rng.integers(-900, 900, 5).astype(np.int32))],
                       {"group": 5, "strides": [2, 2], "pads": [1, 0, 2, 1], "relu": 1}))
    wm = c(rng.integers(-128, 128, (12, 1, 2, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [img, f32(0.02), c(np.uint8(100)), wm, f32(0.004), c(np.int8(0)),
                                        f32(0.05), c(np.uint8(128))],
                       {"group": 6, "strides": [1, 2], "dilations": [2, 1], "pads": [1, 1, 1, 1]}))
    outs.append(b.add1("conv_integer", [img, c(rng.integers(0, 256, (6, 1, 3, 3)).astype(np.uint8)), c(np.uint8(7)),
                                        c(rng.integers(0, 256, 6).astype(np.uint8))], {"group": 6, "pads": [1, 1, 1, 1]}))
    # one spatial dim (the general im2col)
    seq = b.input("seq", TensorType(DType.u8, (2, 4, 13)))
    outs.append(b.add1("conv_integer", [seq, c(rng.integers(-128, 128, (3, 4, 3)).astype(np.int8))],
                       {"strides": [2], "pads": [1, 2]}))
    outs.extend(b.add("dynamic_quantize_linear", [x], num_outputs=3))
    # per-tensor dequantize (the vectorised runs): uint8 with a zero point, int8 without
    outs.append(b.add1("dequantize_linear", [xu, f32(0.03), c(np.uint8(120))]))
    outs.append(b.add1("dequantize_linear", [xs8, f32(0.02)]))
    # qlinear_add: mixed signedness with relu (scales that make exact half-way ties), int8 saturating
    outs.append(b.add1("qlinear_add", [xu, f32(0.25), c(np.uint8(120)), xs8, f32(0.5), c(np.int8(3)), f32(1.0),
                                       c(np.uint8(7))], {"relu": 1}))
    outs.append(b.add1("qlinear_add", [xs8, f32(0.02), c(np.int8(3)), xs8, f32(0.037), c(np.int8(-9)), f32(0.011),
                                       c(np.int8(-5))]))
    b.output(*outs)
    inputs = {"x": rng.standard_normal((37, 70)).astype(np.float32) * 2,
              "img": rng.integers(0, 256, (2, 6, 9, 11)).astype(np.uint8),
              "bi8": rng.integers(-128, 128, (70, 45)).astype(np.int8),
              "img8": rng.integers(-128, 128, (2, 5, 8, 7)).astype(np.int8),
              "seq": rng.integers(0, 256, (2, 4, 13)).astype(np.uint8)}
    return b.graph, inputs


# Each target builds a different integer micro-kernel: VNNI (native, on a CPU with it), AVX-512BW,
# AVX2 and portable C (generic; wasm32 compiles the same C: tests/quant/test_qdq_models.py runs it).
@pytest.mark.parametrize("target", runnable("native", "x86_avx512", "x86_avx2", "generic"))
def test_c_kernels_match_the_reference_bit_for_bit(target: str, tmp_path: object) -> None:
    graph, inputs = _graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    got = cuvil.compile(graph, target, passes="", cache_dir=str(tmp_path)).run(inputs)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name


def test_symbolic_batch_matches_the_reference(tmp_path: object) -> None:
    """QLinearConv and QLinearMatMul with a symbolic batch dim: inference stays symbolic and the
    native build agrees with the reference at several batch sizes."""
    rng = np.random.default_rng(3)
    init = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in {
        "s": np.float32(0.05), "z": np.uint8(128), "w": rng.integers(-128, 128, (4, 3, 3, 3)).astype(np.int8),
        "ws": rng.uniform(0.01, 0.02, 4).astype(np.float32), "wz": np.zeros(4, np.int8),
        "ys": np.float32(0.3), "yz": np.uint8(60), "b": rng.integers(-128, 128, (10, 5)).astype(np.int8),
        "bs": np.float32(0.01), "bz": np.int8(0)}.items()]
    nodes = [oh.make_node("QLinearConv", ["x", "s", "z", "w", "ws", "wz", "ys", "yz"], ["c"], pads=[1, 1, 1, 1]),
             oh.make_node("QLinearMatMul", ["c", "ys", "yz", "b", "bs", "bz", "s", "z"], ["y"])]
    g = oh.make_graph(nodes, "q", [oh.make_tensor_value_info("x", TensorProto.UINT8, ["n", 3, 6, 10])],
                      [oh.make_tensor_value_info("y", TensorProto.UINT8, None)], init)
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 21)])
    ref = cuvil.compile(model, "ref", dims={"n": (1, 8)})
    native = cuvil.compile(model, "native", dims={"n": (1, 8)}, cache_dir=str(tmp_path))
    assert str(native.output_specs[0].type.shape[0]) == "n"
    for n in (1, 3):
        x = rng.integers(0, 256, (n, 3, 6, 10)).astype(np.uint8)
        want, got = ref(x)[0], native(x)[0]
        assert got.shape == (n, 4, 6, 5) and np.array_equal(got, want)


def _qdq_add(relu: bool, out: type, shape: tuple[int, ...] = (3, 5, 7, 11)) -> tuple[object, dict[str, np.ndarray]]:
    """``quantize(dequantize(a) + dequantize(b) [-> relu])``, unfused, and its inputs."""
    rng = np.random.default_rng(11)
    b = Builder()
    a = b.input("a", TensorType(DType.u8, shape))
    bb = b.input("b", TensorType(DType.i8, shape))
    c = b.constant
    da = b.add1("dequantize_linear", [a, c(np.float32(0.0312)), c(np.uint8(131))])
    db = b.add1("dequantize_linear", [bb, c(np.float32(0.0173))])
    s = b.add1("add", [da, db])
    if relu:
        s = b.add1("relu", [s])
    zp = np.asarray(-3 if out is np.int8 else 9, out)
    b.output(b.add1("quantize_linear", [s, c(np.float32(0.0291)), c(zp)]))
    return b.graph, {"a": rng.integers(0, 256, shape).astype(np.uint8),
                     "b": rng.integers(-128, 128, shape).astype(np.int8)}


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("out", [np.uint8, np.int8])
def test_qlinear_add_equals_the_unfused_composition_bit_for_bit(relu: bool, out: type, tmp_path: object) -> None:
    """fold-qdq's qlinear_add, natively, gives exactly the reference's unfused QDQ result."""
    graph, inputs = _qdq_add(relu, out)
    want = cuvil.compile(graph, "ref").run(inputs)
    m = cuvil.compile(graph, "native", passes="fold-qdq", cache_dir=str(tmp_path))
    assert [n.op for n in m.graph.nodes if n.op not in ("constant",)] == ["qlinear_add"]
    folded_ref = cuvil.compile(m.graph, "ref").run(inputs)
    got = m.run(inputs)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name
        assert np.array_equal(folded_ref[name], w), name


def test_qlinear_add_refuses_operands_of_different_shapes() -> None:
    b = Builder()
    a = b.input("a", TensorType(DType.u8, (2, 3)))
    x = b.input("x", TensorType(DType.u8, (3, 2)))
    one, z = b.constant(np.float32(1)), b.constant(np.uint8(0))
    with pytest.raises(CuvilError, match="one shape"):
        b.add1("qlinear_add", [a, one, z, x, one, z, one, z])

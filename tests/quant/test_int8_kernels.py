"""The int8 convolution kernels (``cuvil_qconv.h``, ``cuvil_qgemm.h``) bit for bit against Cuvil's
reference, on the shapes their vectorized paths split differently: depthwise planes wider than a
vector and with more taps than one pass holds, pointwise convolutions with partial tiles, zero
points on both sides and multipliers that are not finite, weights within [-64, 64] (the AVX2 byte path)
against extreme data; and the same bytes whatever the thread
count.  Also: int8 PTQ runs a residual network's adds and max-pool on 8-bit data."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuvil
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.types import TensorType
from cuvil.metrics import relative_l2
from cuvil.verify.runner import target_unavailable
from tests.conftest import assert_clean_under_sanitizers, runnable


def _f32(b: Builder, v: Any) -> Any:
    return b.constant(np.asarray(v, np.float32))


def _conv_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(21)
    b = Builder()
    c = b.constant
    xi = b.input("xi", TensorType(DType.i8, (2, 6, 21, 37)))
    xu = b.input("xu", TensorType(DType.u8, (1, 19, 9, 13)))
    outs = []
    # depthwise, int8: stride 1 (rows wider than 32 sums), then stride 2 with uneven pads, per-channel
    # weight zero points, bias and relu
    wd = c(rng.integers(-128, 128, (6, 1, 3, 3)).astype(np.int8))
    wzp = c(rng.integers(-6, 6, 6).astype(np.int8))
    for attrs in ({"group": 6, "pads": [1, 1, 1, 1]},
                  {"group": 6, "strides": [2, 2], "pads": [0, 1, 2, 1], "relu": 1}):
        outs.append(b.add1("qlinear_conv", [xi, _f32(b, 0.03), c(np.int8(-5)), wd,
                                            _f32(b, rng.uniform(0.001, 0.01, 6)), wzp, _f32(b, 0.05), c(np.int8(4)),
                                            c(rng.integers(-3000, 3000, 6).astype(np.int32))], attrs))
    # depthwise, stride 2 on rows too wide for the row masks made once per plane (more than 8 steps of 32
    # columns)
    xw = b.input("xw", TensorType(DType.i8, (1, 2, 5, 530)))
    w2d = c(rng.integers(-128, 128, (2, 1, 3, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xw, _f32(b, 0.03), c(np.int8(2)), w2d, _f32(b, 0.004), c(np.int8(0)),
                                        _f32(b, 0.05), c(np.int8(-1))], {"group": 2, "strides": [2, 2],
                                                                         "pads": [1, 1, 1, 1]}))
    # depthwise on short rows (the plane is filled 16 or 8 columns at a time, or one by one below 8):
    # int8 rows of 20 and uint8 rows of 13, strides 1 and 2
    xs = b.input("xs", TensorType(DType.i8, (1, 4, 9, 20)))
    w4 = c(rng.integers(-128, 128, (4, 1, 3, 3)).astype(np.int8))
    w19 = c(rng.integers(-128, 128, (19, 1, 3, 3)).astype(np.int8))
    for xv, wv, zx, g_ in ((xs, w4, c(np.int8(3)), 4), (xu, w19, c(np.uint8(131)), 19)):
        for attrs in ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"pads": [1, 2, 1, 0]}, {"strides": [1, 2], "pads": [0, 2, 0, 1]}):
            outs.append(b.add1("qlinear_conv", [xv, _f32(b, 0.03), zx, wv, _f32(b, 0.004), c(np.int8(0)), _f32(b, 0.05),
                                                c(np.int8(1))], {"group": g_, **attrs}))
    # depthwise on rows of 6 and of 3 (the plane filled 4 columns at a time, overlapping, or one by one;
    # the stride-2 phases 4 at a time or one by one; output rows copied in 4-byte moves or bytes)
    for shape in ((1, 3, 7, 6), (1, 2, 5, 3)):
        xt = b.input(f"xt{shape[3]}", TensorType(DType.u8, shape))
        wt = c(rng.integers(-64, 65, (shape[1], 1, 3, 3)).astype(np.int8))
        for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"strides": [1, 2]}):
            outs.append(b.add1("qlinear_conv", [xt, _f32(b, 0.03), c(np.uint8(7)), wt, _f32(b, 0.004), c(np.int8(0)),
                                                _f32(b, 0.05), c(np.uint8(3))], {"group": shape[1], **attrs}))
    # depthwise on planes of at most 256 outputs, where channels go in vector lanes: 160 int8 channels
    # (10 blocks of 16, over threads) on a batch of 2, per-channel multipliers and biases, strides 1 and 2
    xq = b.input("xq", TensorType(DType.i8, (2, 160, 14, 14)))
    wq = c(rng.integers(-64, 65, (160, 1, 3, 3)).astype(np.int8))
    for attrs in ({"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 0, 1, 1]}):
        outs.append(b.add1("qlinear_conv", [xq, _f32(b, 0.03), c(np.int8(-2)), wq, _f32(b, rng.uniform(0.001, 0.01, 160)),
                                            c(np.zeros(160, np.int8)), _f32(b, 0.04), c(np.int8(5)),
                                            c(rng.integers(-3000, 3000, 160).astype(np.int32))], {"group": 160, **attrs}))
    # 5x5 and dilated 3x3 depthwise on 9x9 planes (13 and 5 tap pairs), 20 channels (a block of 16 and 4)
    xd = b.input("xd", TensorType(DType.u8, (1, 20, 9, 9)))
    for k, attrs in ((5, {"pads": [2, 2, 2, 2]}), (3, {"dilations": [2, 2], "pads": [2, 1, 2, 1]})):
        wd5 = c(rng.integers(-64, 65, (20, 1, k, k)).astype(np.int8))
        outs.append(b.add1("qlinear_conv", [xd, _f32(b, 0.03), c(np.uint8(100)), wd5, _f32(b, 0.002), c(np.int8(0)),
                                            _f32(b, 0.06), c(np.uint8(9))], {"group": 20, **attrs}))
    # depthwise 9x9 (81 taps: more than one pass of the vectorized kernel), dilated, channel multiplier 2,
    # uint8 weights, int32 output
    w9 = c(rng.integers(0, 256, (12, 1, 9, 9)).astype(np.uint8))
    outs.append(b.add1("conv_integer", [xi, w9, c(np.int8(3)), c(rng.integers(120, 136, 12).astype(np.uint8))],
                       {"group": 6, "dilations": [1, 2], "pads": [4, 8, 4, 8]}))
    # pointwise: K = 19 (not a multiple of 4), 117 columns (partial 32-column panels), 13 and 40 rows;
    # uint8 activations with a zero point; per-channel weight zero points (the row-sum terms)
    w1 = c(rng.integers(-128, 128, (13, 19, 1, 1)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xu, _f32(b, 0.02), c(np.uint8(131)), w1, _f32(b, rng.uniform(0.001, 0.01, 13)),
                                        c(rng.integers(-4, 4, 13).astype(np.int8)), _f32(b, 0.2), c(np.uint8(77)),
                                        c(rng.integers(-900, 900, 13).astype(np.int32))]))
    w2 = c(rng.integers(-128, 128, (40, 19, 1, 1)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xu, _f32(b, 0.02), c(np.uint8(131)), w2, _f32(b, 0.004), c(np.int8(0)),
                                        _f32(b, 0.3), c(np.int8(-9))], {"strides": [2, 1]}))
    # a multiplier that is not finite (output scale 0): NaN products give the zero point, the others saturate
    outs.append(b.add1("qlinear_conv", [xu, _f32(b, 0.02), c(np.uint8(131)), w1, _f32(b, 0.004), c(np.int8(0)),
                                        _f32(b, 0.0), c(np.uint8(100))]))
    outs.append(b.add1("qlinear_conv", [xi, _f32(b, 0.03), c(np.int8(0)), wd, _f32(b, 0.01), c(np.int8(0)),
                                        _f32(b, 0.0), c(np.int8(2))], {"group": 6, "pads": [1, 1, 1, 1]}))
    # a matmul: per-column multipliers and biases, int8 x int8
    a = b.input("a", TensorType(DType.i8, (35, 70)))
    outs.append(b.add1("qlinear_matmul", [a, _f32(b, 0.02), c(np.int8(3)), c(rng.integers(-128, 128, (70, 45)).astype(
        np.int8)), _f32(b, rng.uniform(0.001, 0.01, 45)), c(np.zeros(45, np.int8)), _f32(b, 0.4), c(np.int8(-7)),
        c(rng.integers(-2000, 2000, 45).astype(np.int32))]))
    # the same product dequantized to float32 (per-column scales, column zero points, a bias), and an
    # unsigned one without bias over a partial column panel
    outs.append(b.add1("qlinear_matmul_float", [a, _f32(b, 0.02), c(np.int8(3)), c(rng.integers(-128, 128, (70, 45)).astype(
        np.int8)), _f32(b, rng.uniform(0.001, 0.01, 45)), c(rng.integers(-3, 3, 45).astype(np.int8)),
        c(rng.integers(-2000, 2000, 45).astype(np.int32))]))
    outs.append(b.add1("qlinear_matmul_float", [a, _f32(b, 0.5), c(np.int8(0)), c(rng.integers(0, 256, (70, 7)).astype(
        np.uint8)), _f32(b, 0.25), c(np.uint8(128))]))
    # weights within [-64, 64] (the AVX2 byte path's signed side): a 3x3 conv (im2col) on int8 data with
    # per-channel weight zero points, a pointwise one on uint8 data with K = 19, and matmuls whose
    # narrow side is the column operand, on int8 data (shifted to unsigned) and on uint8 data
    w7 = c(rng.integers(-64, 65, (10, 6, 3, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xi, _f32(b, 0.03), c(np.int8(-5)), w7, _f32(b, rng.uniform(0.001, 0.01, 10)),
                                        c(rng.integers(-3, 3, 10).astype(np.int8)), _f32(b, 0.1), c(np.int8(6)),
                                        c(rng.integers(-3000, 3000, 10).astype(np.int32))], {"pads": [1, 0, 1, 2]}))
    w7p = c(np.where(rng.random((13, 19, 1, 1)) < 0.2, 64, rng.integers(-64, 65, (13, 19, 1, 1))).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xu, _f32(b, 0.02), c(np.uint8(131)), w7p, _f32(b, 0.004), c(np.int8(0)),
                                        _f32(b, 0.05), c(np.uint8(120))]))
    b7v = np.where(rng.random((70, 45)) < 0.2, -64, rng.integers(-64, 65, (70, 45))).astype(np.int8)
    b7 = c(b7v)
    outs.append(b.add1("qlinear_matmul", [a, _f32(b, 0.02), c(np.int8(3)), b7, _f32(b, rng.uniform(0.001, 0.01, 45)),
                                          c(np.zeros(45, np.int8)), _f32(b, 0.1), c(np.int8(-7)),
                                          c(rng.integers(-2000, 2000, 45).astype(np.int32))]))
    # 38 columns: a last panel of 6 (the half-width byte kernel), 35 rows (a last tile of 5)
    outs.append(b.add1("qlinear_matmul", [a, _f32(b, 0.02), c(np.int8(3)), c(b7v[:, :38].copy()), _f32(b, 0.004),
                                          c(np.int8(0)), _f32(b, 0.1), c(np.int8(2))]))
    # 3x3 convolutions with K = 576: grouped (two groups of 64 channels) on a batch of 2 with 7-bit
    # weights, and 8-bit weights on 60-column rows
    xg = b.input("xg", TensorType(DType.u8, (2, 128, 20, 30)))
    wg = c(rng.integers(-64, 65, (16, 64, 3, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xg, _f32(b, 0.02), c(np.uint8(128)), wg, _f32(b, rng.uniform(0.001, 0.004, 16)),
                                        c(np.zeros(16, np.int8)), _f32(b, 0.5), c(np.uint8(127)),
                                        c(rng.integers(-3000, 3000, 16).astype(np.int32))],
                       {"group": 2, "pads": [1, 1, 1, 1]}))
    xr = b.input("xr", TensorType(DType.i8, (1, 64, 28, 62)))
    wr = c(rng.integers(-128, 128, (9, 64, 3, 3)).astype(np.int8))
    outs.append(b.add1("qlinear_conv", [xr, _f32(b, 0.02), c(np.int8(-3)), wr, _f32(b, 0.002), c(np.int8(0)),
                                        _f32(b, 0.7), c(np.int8(5))], {"pads": [0, 0, 0, 0]}))
    au = b.input("au", TensorType(DType.u8, (9, 70)))
    outs.append(b.add1("matmul_integer", [au, b7, c(np.uint8(200)), c(rng.integers(-2, 2, 45).astype(np.int8))]))
    b.output(*outs)
    inputs = {"xi": rng.integers(-128, 128, (2, 6, 21, 37)).astype(np.int8),
              "xu": rng.integers(0, 256, (1, 19, 9, 13)).astype(np.uint8),
              "a": rng.integers(-128, 128, (35, 70)).astype(np.int8),
              "xw": rng.integers(-128, 128, (1, 2, 5, 530)).astype(np.int8),
              "xs": rng.integers(-128, 128, (1, 4, 9, 20)).astype(np.int8),
              "xg": rng.integers(0, 256, (2, 128, 20, 30)).astype(np.uint8),
              "xr": rng.integers(-128, 128, (1, 64, 28, 62)).astype(np.int8),
              "xd": rng.integers(0, 256, (1, 20, 9, 9)).astype(np.uint8),
              "xq": rng.integers(-128, 128, (2, 160, 14, 14)).astype(np.int8),
              "xt6": rng.integers(0, 256, (1, 3, 7, 6)).astype(np.uint8),
              "xt3": rng.integers(0, 256, (1, 2, 5, 3)).astype(np.uint8),
              "au": np.where(rng.random((9, 70)) < 0.3, 255, rng.integers(0, 256, (9, 70))).astype(np.uint8)}
    inputs["a"][:5] = -128  # extreme bytes against extreme narrow weights: the largest pair sums
    inputs["xu"].reshape(-1)[:40] = 131  # the zero point itself: products of 0 (NaN under an infinite multiplier)
    inputs["xi"][:, :, :4, :] = 0
    return b.graph, inputs


@pytest.mark.parametrize("target", [*runnable("native", "x86_avx512", "x86_avx2", "generic"),
                                    pytest.param("wasm32", marks=pytest.mark.slow)])
def test_int8_conv_kernels_match_the_reference_bit_for_bit(target: str, tmp_path: Path) -> None:
    graph, inputs = _conv_graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    got = cuvil.compile(graph, target, passes="", cache_dir=str(tmp_path)).run(inputs)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name


def run_twice_against_the_reference(build: Callable[[Graph], Any]) -> None:
    """For the sanitized children: ``build(graph)`` compiles the kernel graph; its outputs, on each
    of two calls, must be the reference's bit for bit.  Prints "clean"."""
    graph, inputs = _conv_graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    m = build(graph)
    for _ in range(2):
        got = m.run(inputs)
        bad = [n for n, w in want.items() if not np.array_equal(got[n], w)]
        assert not bad, bad
    print("clean")


_SANITIZED_CHILD = """
import sys
import cuvil
from tests.quant.test_int8_kernels import run_twice_against_the_reference

run_twice_against_the_reference(lambda graph: cuvil.compile(graph, sys.argv[1], passes="", sanitize=True,
                                                            cache_dir=sys.argv[2], num_threads=2))
"""


@pytest.mark.slow
def test_int8_kernels_are_clean_under_asan_and_ubsan(tmp_path: Path) -> None:
    """The int8 kernels' vector paths (x86_avx2 where this CPU runs it: the byte products, the
    depthwise planes and channel blocks) under AddressSanitizer and UBSan, on two threads."""
    target = "x86_avx2" if not target_unavailable("x86_avx2") else "generic"
    assert_clean_under_sanitizers(_SANITIZED_CHILD, target, str(tmp_path / "cache"))


def test_int8_conv_kernels_give_the_same_bytes_on_two_threads(tmp_path: Path) -> None:
    graph, inputs = _conv_graph()
    one = cuvil.compile(graph, "native", passes="", cache_dir=str(tmp_path), num_threads=1).run(inputs)
    two = cuvil.compile(graph, "native", passes="", cache_dir=str(tmp_path), num_threads=2)
    for _ in range(3):
        got = two.run(inputs)
        for name, w in one.items():
            assert np.array_equal(got[name], w), name


# PTQ: residual adds and max-pool on 8-bit data ---------------------------------------------------


def _residual_net() -> Graph:
    """conv -> relu -> max_pool -> [conv -> relu -> conv] + skip -> relu -> conv -> add(graph input branch)."""
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (1, 3, 20, 20)))

    def conv(v: Any, cin: int, cout: int, name: str) -> Any:
        w = b.constant((rng.standard_normal((cout, cin, 3, 3)) * (0.5 / cin) ** 0.5).astype(np.float32))
        bias = b.constant(rng.uniform(-0.1, 0.1, cout).astype(np.float32))
        return b.add1("conv", [v, w, bias], {"pads": [1, 1, 1, 1]}, names=[name])

    h = b.add1("relu", [conv(x, 3, 8, "c0")], names=["r0"])
    p = b.add1("max_pool", [h], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, names=["pool"])
    t = conv(b.add1("relu", [conv(p, 8, 8, "c1")], names=["r1"]), 8, 8, "c2")
    s = b.add1("relu", [b.add1("add", [t, p], names=["sum"])], names=["r2"])
    y = conv(s, 8, 4, "c3")
    # an add read by no quantized node (a graph output): stays float32
    b.output(b.add1("add", [y, b.add1("relu", [y], names=["ry"])], names=["out"]))
    return b.graph


def test_ptq_runs_a_float_classifier_as_an_int8_product(tmp_path: Path) -> None:
    """A gemm whose logits are the graph output: PTQ quantizes its operands and fold-qdq makes it one
    integer product dequantized to float32 (no float weights read at run time)."""
    rng = np.random.default_rng(3)
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (2, 24)))
    h = b.add1("relu", [b.add1("gemm", [x, _f32(b, rng.standard_normal((40, 24)) * 0.3), _f32(b, rng.uniform(-.1, .1, 40))],
                               {"transB": 1})])
    b.output(b.add1("gemm", [h, _f32(b, rng.standard_normal((40, 10)) * 0.3), _f32(b, rng.uniform(-.1, .1, 10))]))
    data = [(rng.standard_normal((2, 24)).astype(np.float32),) for _ in range(64)]
    m = cuvil.compile(b.graph, "native", cache_dir=str(tmp_path), quant_dtype="int8", calibration_dataset=data)
    assert m.graph is not None
    assert [n.op for n in m.graph.nodes if n.op in ("gemm", "matmul", "qlinear_matmul", "qlinear_matmul_float")] == [
        "qlinear_matmul", "qlinear_matmul_float"]
    t = rng.standard_normal((2, 24)).astype(np.float32)
    got = m(t)[0]
    assert np.array_equal(got, cuvil.compile(m.graph, "ref")(t)[0])
    ref = cuvil.compile(b.graph, "ref")(t)[0]
    assert relative_l2(got, ref) < 0.05


def test_ptq_runs_residual_adds_and_max_pool_on_int8(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((1, 3, 20, 20)).astype(np.float32),) for _ in range(64)]
    m = cuvil.compile(_residual_net(), "native", cache_dir=str(tmp_path), quant_dtype="int8",
                      calibration_dataset=data)
    assert m.graph is not None
    pools = [n for n in m.graph.nodes if n.op == "max_pool"]
    assert len(pools) == 1 and pools[0].inputs[0] is not None and pools[0].inputs[0].type.dtype is DType.i8
    adds = [n for n in m.graph.nodes if n.op == "qlinear_add"]
    assert len(adds) == 1 and adds[0].attrs["relu"] == 1
    out = m.graph.outputs[0]
    assert out.producer is not None and out.producer.op != "qlinear_add" and out.type.dtype is DType.f32
    q = m.info.precision
    assert q is not None
    acts = q["quantization"]["activations"]
    assert acts["pool"] == acts["r0"]  # the pool passes its input's scale and zero point on
    # the native build computes exactly what the reference interpreter does on the quantized graph
    x = rng.standard_normal((1, 3, 20, 20)).astype(np.float32)
    want = cuvil.compile(m.graph, "ref")(x)[0]
    got = m(x)[0]
    assert np.array_equal(got, want)
    # and stays close to float32
    ref = cuvil.compile(_residual_net(), "ref")(x)[0]
    assert relative_l2(got, ref) < 0.05

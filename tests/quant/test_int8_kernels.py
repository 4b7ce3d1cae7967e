"""The int8 convolution kernels (``cuvil_qconv.h``, ``cuvil_qgemm.h``) bit for bit against Cuvil's
reference, on the shapes their vectorized paths split differently: depthwise planes wider than a
vector and with more taps than one pass holds, pointwise convolutions with partial tiles, zero
points on both sides and multipliers that are not finite, weights within [-64, 64] (the AVX2 byte path)
against extreme data; and the same bytes whatever the thread
count.  Also: int8 PTQ runs a residual network's adds and max-pool on 8-bit data."""

from __future__ import annotations

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
from tests.support.int8_conv_graph import conv_graph, f32_const
from tests.support.sanitizers import assert_clean_under_sanitizers
from tests.support.targets import runnable


@pytest.mark.parametrize("target", [*runnable("native", "x86_avx512", "x86_avx2", "generic"),
                                    pytest.param("wasm32", marks=pytest.mark.slow)])
def test_int8_conv_kernels_match_the_reference_bit_for_bit(target: str, tmp_path: Path) -> None:
    graph, inputs = conv_graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    got = cuvil.compile(graph, target, passes="", cache_dir=str(tmp_path)).run(inputs)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name


_SANITIZED_CHILD = """
import sys
import cuvil
from tests.support.int8_conv_graph import run_twice_against_the_reference

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
    graph, inputs = conv_graph()
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
    h = b.add1("relu", [b.add1("gemm", [x, f32_const(b, rng.standard_normal((40, 24)) * 0.3), f32_const(b, rng.uniform(-.1, .1, 40))],
                               {"transB": 1})])
    b.output(b.add1("gemm", [h, f32_const(b, rng.standard_normal((40, 10)) * 0.3), f32_const(b, rng.uniform(-.1, .1, 10))]))
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


@pytest.mark.slow  # quantizes and builds a residual network: tens of seconds
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

"""The fold-batchnorm pass: golden IR text, its rules, and the error folding introduces.

Folding changes rounding (the weights are scaled and rounded once to float32); the oracle is
the reference interpreter on the unfolded graph, with relative L2 <= 1e-6 in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.backends.ref import run_graph
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.types import TensorType
from cuvil.ir.verify import verify
from cuvil.metrics import relative_l2
from cuvil.passes.fold_batchnorm import FoldBatchNorm

F32 = DType.f32


def _bn(b: Builder, x: Value, c: int, rng: np.random.Generator, eps: float = 1e-5) -> Value:
    params = [rng.uniform(0.5, 1.5, c), rng.standard_normal(c), rng.standard_normal(c) * 0.5, rng.uniform(0.1, 2.0, c)]
    consts = [b.constant(p.astype(x.type.dtype.np)) for p in params]
    return b.add1("batch_norm", [x, *consts], {"epsilon": eps})


def _fold(g: Graph, data: list[np.ndarray]) -> float:
    before = run_graph(g, data)[0]
    assert FoldBatchNorm().run(g).changed
    verify(g)
    assert "batch_norm" not in [n.op for n in g.nodes]
    return relative_l2(run_graph(g, data)[0], before)


def test_golden() -> None:
    g = parse_graph("""\
graph main(%x: f32[1, 1, 2, 2]) {
  %w = constant() {value = dense<f32[2, 1, 1, 1]> [1.0, 2.0]} : f32[2, 1, 1, 1]
  %s = constant() {value = dense<f32[2]> [2.0, 3.0]} : f32[2]
  %b = constant() {value = dense<f32[2]> [0.5, -1.0]} : f32[2]
  %m = constant() {value = dense<f32[2]> [1.0, 0.0]} : f32[2]
  %v = constant() {value = dense<f32[2]> [4.0, 1.0]} : f32[2]
  %c = conv(%x, %w) : f32[1, 2, 2, 2]
  %y = batch_norm(%c, %s, %b, %m, %v) {epsilon = 0.0} : f32[1, 2, 2, 2]
  return %y
}
""")
    assert FoldBatchNorm().run(g).changed
    # s = scale / sqrt(var) = [1, 3]: W = [1, 6], bias = B - mean * s = [-0.5, -1]
    assert print_graph(g) == """\
graph main(%x: f32[1, 1, 2, 2]) {
  %conv_w = constant() {value = dense<f32[2, 1, 1, 1]> [1.0, 6.0]} : f32[2, 1, 1, 1]
  %conv_b = constant() {value = dense<f32[2]> [-0.5, -1.0]} : f32[2]
  %y = conv(%x, %conv_w, %conv_b) : f32[1, 2, 2, 2]
  return %y
}
"""


@pytest.mark.parametrize("group,bias", [(1, False), (1, True), (4, True)])
def test_conv(group: int, bias: bool) -> None:
    rng = np.random.default_rng(group + bias)
    b = Builder()
    x = b.input("x", TensorType(F32, (2, 8, 10, 10)))
    w = b.constant(rng.standard_normal((12, 8 // group, 3, 3)).astype(np.float32) * 0.2)
    ins = [x, w] + ([b.constant(rng.standard_normal(12).astype(np.float32))] if bias else [])
    c = b.add1("conv", ins, {"pads": [1, 1, 1, 1], "group": group})
    b.output(b.add1("relu", [_bn(b, c, 12, rng)]))
    err = _fold(b.graph, [rng.standard_normal((2, 8, 10, 10)).astype(np.float32)])
    assert err <= 1e-6
    assert [n.op for n in b.graph.nodes if n.op != "constant"] == ["conv", "relu"]


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm(trans_b: int) -> None:
    rng = np.random.default_rng(trans_b)
    b = Builder()
    x = b.input("x", TensorType(F32, (4, 32)))
    wshape = (16, 32) if trans_b else (32, 16)
    gm = b.add1("gemm", [x, b.constant(rng.standard_normal(wshape).astype(np.float32)),
                         b.constant(rng.standard_normal(16).astype(np.float32))],
                {"transB": trans_b, "alpha": 0.5, "beta": 2.0})
    b.output(_bn(b, gm, 16, rng))
    assert _fold(b.graph, [rng.standard_normal((4, 32)).astype(np.float32)]) <= 1e-6


def test_matmul_becomes_gemm() -> None:
    rng = np.random.default_rng(5)
    b = Builder()
    x = b.input("x", TensorType(F32, (4, 32)))
    mm = b.add1("matmul", [x, b.constant(rng.standard_normal((32, 16)).astype(np.float32))])
    b.output(_bn(b, mm, 16, rng))
    assert _fold(b.graph, [rng.standard_normal((4, 32)).astype(np.float32)]) <= 1e-6
    assert [n.op for n in b.graph.nodes if n.op != "constant"] == ["gemm"]


def test_not_folded_when_the_product_is_read_elsewhere_or_weights_are_computed() -> None:
    rng = np.random.default_rng(1)
    b = Builder()
    x = b.input("x", TensorType(F32, (1, 2, 4, 4)))
    c = b.add1("conv", [x, b.constant(np.ones((3, 2, 1, 1), np.float32))])
    b.output(_bn(b, c, 3, rng), c)  # the conv's result is an output too
    w = b.input("w", TensorType(F32, (3, 2, 1, 1)))
    b.output(_bn(b, b.add1("conv", [x, w]), 3, rng))  # computed weight
    mm = b.add1("matmul", [b.input("a", TensorType(F32, (2, 3, 4))), b.constant(np.ones((4, 5), np.float32))])
    b.output(_bn(b, mm, 3, rng))  # 3-D matmul: the channel axis is not the columns of B
    assert not FoldBatchNorm().run(b.graph).changed


def test_resnet_block_native_error(tmp_path: object) -> None:
    """Conv + BN + ReLU, twice, with a residual: folded and compiled, against the unfolded reference."""
    rng = np.random.default_rng(11)
    b = Builder()
    x = b.input("x", TensorType(F32, (1, 16, 14, 14)))
    h = x
    for _ in range(2):
        w = b.constant(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1)
        h = b.add1("relu", [_bn(b, b.add1("conv", [h, w], {"pads": [1, 1, 1, 1]}), 16, rng)])
    b.output(b.add1("add", [h, x]))
    g = b.graph
    data = [rng.standard_normal((1, 16, 14, 14)).astype(np.float32)]
    before = run_graph(g, data)[0]
    assert _fold(g, data) <= 1e-6
    out = cuvil.compile(g, target="native", cache_dir=str(tmp_path))(*data)[0]
    assert relative_l2(out, before) <= 1e-5  # folding (1e-6) plus the C kernels' own summation order

"""The fusion passes (recognize-gelu, fuse-epilogue, fuse-elementwise) and the fused ops' kernels.

Oracles: golden IR text for each pass; the reference interpreter on the unfused graph (fused
regions run the same ops, so the fused reference must agree exactly, and GELU within float32
rounding); the native C target on the unfused graph (relative L2 <= 1e-6).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

import cuvil
import cuvil.ops
from cuvil.backends.ref import run_graph
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ir.verify import verify
from cuvil.metrics import relative_l2
from cuvil.ops.registry import ELEMENTWISE
from cuvil.passes.fuse_elementwise import FuseElementwise, RecognizeGelu
from cuvil.passes.fuse_epilogue import FuseEpilogue

F32 = DType.f32


def inputs_for(g: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(v.type.concrete_shape({})).astype(v.type.dtype.np) for v in g.inputs]


def ops_of(g: Graph) -> list[str]:
    return [n.op for n in g.nodes if n.op != "constant"]


def run_pass(p: object, g: Graph) -> bool:
    changed = p.run(g).changed  # type: ignore[attr-defined]
    verify(g)
    return bool(changed)


def check_golden(p: object, before: str, after: str) -> None:
    g = parse_graph(before)
    assert run_pass(p, g)
    text = print_graph(g)
    assert text == after
    assert print_graph(parse_graph(text)) == text  # fused regions round-trip through the text form


# Golden IR text ------------------------------------------------------------------------------


def test_golden_fuse_elementwise() -> None:
    check_golden(FuseElementwise(), """\
graph main(%x: f32[2, 4], %b: f32[4]) {
  %t = add(%x, %b) : f32[2, 4]
  %u = sigmoid(%t) : f32[2, 4]
  %y = mul(%u, %x) : f32[2, 4]
  return %y
}
""", """\
graph main(%x: f32[2, 4], %b: f32[4]) {
  %y = fused_elementwise(%x, %b) {body = graph body(%in0: f32[2, 4], %in1: f32[4]) {
      %t = add(%in0, %in1) : f32[2, 4]
      %u = sigmoid(%t) : f32[2, 4]
      %y.1 = mul(%u, %in0) : f32[2, 4]
      return %y.1
    }} : f32[2, 4]
  return %y
}
""")


def test_golden_fuse_epilogue() -> None:
    check_golden(FuseEpilogue(), """\
graph main(%x: f32[1, 2, 4, 4], %w: f32[3, 2, 1, 1], %r: f32[1, 3, 4, 4]) {
  %bias = constant() {value = dense<f32[3, 1, 1]> [1.0, 2.0, 3.0]} : f32[3, 1, 1]
  %c = conv(%x, %w) : f32[1, 3, 4, 4]
  %cb = add(%c, %bias) : f32[1, 3, 4, 4]
  %s = add(%r, %cb) : f32[1, 3, 4, 4]
  %y = relu(%s) : f32[1, 3, 4, 4]
  return %y
}
""", """\
graph main(%x: f32[1, 2, 4, 4], %w: f32[3, 2, 1, 1], %r: f32[1, 3, 4, 4]) {
  %conv_bias = constant() {value = dense<f32[3]> [1.0, 2.0, 3.0]} : f32[3]
  %y = fused_conv(%x, %w, %conv_bias, %r) {epilogue = graph epilogue(%acc: f32[1, 3, 4, 4], %in0: f32[1, 3, 4, 4]) {
      %s = add(%in0, %acc) : f32[1, 3, 4, 4]
      %y.1 = relu(%s) : f32[1, 3, 4, 4]
      return %y.1
    }} : f32[1, 3, 4, 4]
  return %y
}
""")


def test_golden_recognize_gelu() -> None:
    check_golden(RecognizeGelu(), """\
graph main(%x: f32[2, 8]) {
  %sqrt2 = constant() {value = dense<f32[]> [1.4142135381698608]} : f32[]
  %one = constant() {value = dense<f32[]> [1.0]} : f32[]
  %half = constant() {value = dense<f32[]> [0.5]} : f32[]
  %d = div(%x, %sqrt2) : f32[2, 8]
  %e = erf(%d) : f32[2, 8]
  %p = add(%e, %one) : f32[2, 8]
  %m = mul(%x, %p) : f32[2, 8]
  %y = mul(%m, %half) : f32[2, 8]
  return %y
}
""", """\
graph main(%x: f32[2, 8]) {
  %y = gelu(%x) : f32[2, 8]
  return %y
}
""")


# GELU recognition ----------------------------------------------------------------------------

GeluBuild = Callable[[Builder, object], object]


def _gelu_variants() -> dict[str, GeluBuild]:
    def erf_part(b: Builder, x: object, by_mul: bool) -> object:
        if by_mul:
            u = b.add1("mul", [b.constant(np.float32(1 / math.sqrt(2))), x])
        else:
            u = b.add1("div", [x, b.constant(np.float32(math.sqrt(2)))])
        return b.add1("add", [b.constant(np.float32(1.0)), b.add1("erf", [u])])

    def v1(b: Builder, x: object) -> object:  # x * 0.5 * (1 + erf(x * 1/sqrt2))
        return b.add1("mul", [b.add1("mul", [x, b.constant(np.float32(0.5))]), erf_part(b, x, True)])

    def v2(b: Builder, x: object) -> object:  # (x * s) / 2
        return b.add1("div", [b.add1("mul", [erf_part(b, x, False), x]), b.constant(np.float32(2.0))])

    def v3(b: Builder, x: object) -> object:  # (s * 0.5) * x
        return b.add1("mul", [x, b.add1("mul", [erf_part(b, x, False), b.constant(np.float32(0.5))])])

    return {"half-first": v1, "div-by-two": v2, "half-with-s": v3}


@pytest.mark.parametrize("variant", sorted(_gelu_variants()))
def test_gelu_patterns_become_gelu(variant: str) -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (4, 64)))
    b.output(_gelu_variants()[variant](b, x))  # type: ignore[arg-type]
    g = b.graph
    data = [np.linspace(-8, 8, 256, dtype=np.float32).reshape(4, 64)]
    before = run_graph(g, data)[0]
    assert run_pass(RecognizeGelu(), g)
    assert [n.op for n in g.nodes] == ["gelu"]  # the pattern's constants are gone too
    after = run_graph(g, data)[0]
    assert relative_l2(after, before) <= 1e-6


def test_gelu_pattern_with_a_shared_intermediate_stays() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (4,)))
    e = b.add1("erf", [b.add1("div", [x, b.constant(np.float32(math.sqrt(2)))])])
    p = b.add1("add", [e, b.constant(np.float32(1.0))])
    y = b.add1("mul", [b.add1("mul", [x, p]), b.constant(np.float32(0.5))])
    b.output(y, e)  # erf's result is also an output: removing it would change the graph
    assert not run_pass(RecognizeGelu(), b.graph)


def test_gelu_pattern_with_wrong_constant_stays() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (4,)))
    e = b.add1("erf", [b.add1("div", [x, b.constant(np.float32(1.5))])])
    p = b.add1("add", [e, b.constant(np.float32(1.0))])
    b.output(b.add1("mul", [b.add1("mul", [x, p]), b.constant(np.float32(0.5))]))
    assert not run_pass(RecognizeGelu(), b.graph)


# Elementwise fusion rules --------------------------------------------------------------------


def test_value_read_twice_is_not_fused_into_one_reader() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (8,)))
    t = b.add1("exp", [x])
    y = b.add1("add", [b.add1("neg", [t]), b.add1("sqrt", [t])])
    b.output(y)
    assert run_pass(FuseElementwise(), b.graph)
    assert ops_of(b.graph) == ["exp", "fused_elementwise"]  # exp stays a tensor: no recomputation
    (fused,) = [n for n in b.graph.nodes if n.op == "fused_elementwise"]
    assert [n.op for n in fused.attrs["body"].nodes] == ["neg", "sqrt", "add"]


def test_smaller_producer_is_not_recomputed_per_element() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (4, 8)))
    v = b.input("v", TensorType(F32, (8,)))
    b.output(b.add1("relu", [b.add1("mul", [x, b.add1("exp", [v])])]))
    assert run_pass(FuseElementwise(), b.graph)
    assert ops_of(b.graph) == ["exp", "fused_elementwise"]


def test_graph_outputs_and_max_ops_bound_groups() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (8,)))
    vals = [x]
    for _ in range(6):
        vals.append(b.add1("tanh", [vals[-1]]))
    b.output(vals[-1], vals[3])  # vals[3] is an output: the chain splits there
    assert run_pass(FuseElementwise(max_ops=2), b.graph)
    assert ops_of(b.graph) == ["tanh", "fused_elementwise", "tanh", "fused_elementwise"]
    assert str(FuseElementwise(max_ops=2)) == "fuse-elementwise{max-ops=2}"


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_precision_fuses_with_each_result_rounded(dtype: DType) -> None:
    def graph() -> Graph:
        b = Builder()
        x = b.input("x", TensorType(dtype, (64,)))
        b.output(b.add1("relu", [b.add1("mul", [b.add1("exp", [x]), x])]))
        return b.graph

    g = graph()
    assert run_pass(FuseElementwise(), g)
    assert [n.op for n in g.nodes] == ["fused_elementwise"]
    x = np.random.default_rng(0).standard_normal(64).astype(dtype.np)
    assert run_graph(g, [x])[0].tobytes() == run_graph(graph(), [x])[0].tobytes()


def test_every_fusable_op_has_a_c_scalar_expression() -> None:
    from cuvil.backends.c.kernels.elementwise import SCALAR

    missing = {n for n, d in cuvil.ops.all_ops().items() if ELEMENTWISE in d.traits} - set(SCALAR) - {"clip"}
    assert not missing


# Epilogue fusion rules -----------------------------------------------------------------------


def test_epilogue_stops_at_a_broadcasting_operand_and_a_second_reader() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (1, 2, 4, 4)))
    w = b.constant(np.ones((3, 2, 3, 3), np.float32))
    c = b.add1("conv", [x, w], {"pads": [1, 1, 1, 1]})
    v = b.input("v", TensorType(F32, (1, 3, 1, 1)))  # per channel but computed: not a bias, not an extra
    y = b.add1("mul", [b.add1("relu", [c]), v])
    b.output(y, b.add1("relu", [y]))
    assert run_pass(FuseEpilogue(), b.graph)
    assert ops_of(b.graph) == ["fused_conv", "mul", "relu"]


def test_conv_with_computed_bias_keeps_it() -> None:
    b = Builder()
    x = b.input("x", TensorType(F32, (1, 2, 4, 4)))
    bias = b.input("bias", TensorType(F32, (3,)))
    c = b.add1("conv", [x, b.constant(np.ones((3, 2, 1, 1), np.float32)), bias])
    b.output(b.add1("add", [c, b.constant(np.ones((3, 1, 1), np.float32))]))
    assert not run_pass(FuseEpilogue(), b.graph)  # the constant add is per channel: an unsupported extra


def test_two_products_added_share_no_reader() -> None:
    """conv(x) + conv(x): one anchor takes the add, the other stays a product read as the residual."""
    b = Builder()
    x = b.input("x", TensorType(F32, (1, 4, 5, 5)))
    rng = np.random.default_rng(0)
    c2 = b.add1("conv", [x, b.constant(rng.standard_normal((3, 4, 3, 3)).astype(np.float32)),
                         b.constant(rng.standard_normal(3).astype(np.float32))])
    c3 = b.add1("conv", [x, b.constant(rng.standard_normal((3, 4, 3, 3)).astype(np.float32))])
    b.output(b.add1("add", [c2, c3]))
    g = b.graph
    xs = inputs_for(g)
    (want,) = run_graph(g, xs)
    assert run_pass(FuseEpilogue(), g)
    assert ops_of(g) == ["conv", "fused_conv"]
    (got,) = run_graph(g, xs)
    assert np.array_equal(got, want)


# Numerics: reference and native, fused against unfused ----------------------------------------


def _zoo_graph() -> Graph:
    """Every fusion the passes make, in one small network."""
    rng = np.random.default_rng(7)
    b = Builder()
    x = b.input("x", TensorType(F32, (2, 3, 8, 8)))
    r = b.input("r", TensorType(F32, (2, 4, 8, 8)))
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3)
    c = b.add1("conv", [x, w], {"pads": [1, 1, 1, 1]})
    c = b.add1("add", [c, b.constant(rng.standard_normal((1, 4, 1, 1)).astype(np.float32))])
    c = b.add1("add", [c, r])  # residual
    c = b.add1("clip", [c, b.constant(np.float32(0.0)), b.constant(np.float32(6.0))])  # relu6
    dw = b.constant(rng.standard_normal((4, 1, 3, 3)).astype(np.float32))
    d = b.add1("conv", [c, dw, b.constant(rng.standard_normal(4).astype(np.float32))],
               {"pads": [1, 1, 1, 1], "group": 4})  # depthwise
    d = b.add1("hard_swish", [d])
    f = b.add1("reshape", [d, b.constant(np.array([2, 256], np.int64))])
    m = b.add1("matmul", [f, b.constant(rng.standard_normal((256, 32)).astype(np.float32) * 0.1)])
    m = b.add1("add", [m, b.constant(rng.standard_normal(32).astype(np.float32))])  # row bias
    half = b.add1("mul", [b.constant(np.float32(0.5)), m])
    erf = b.add1("erf", [b.add1("div", [m, b.constant(np.float32(math.sqrt(2)))])])
    m = b.add1("mul", [half, b.add1("add", [b.constant(np.float32(1.0)), erf])])  # GELU written out
    gm = b.add1("gemm", [m, b.constant(rng.standard_normal((10, 32)).astype(np.float32)),
                         b.constant(rng.standard_normal(10).astype(np.float32))], {"transB": 1, "alpha": 0.5})
    s = b.add1("sigmoid", [gm])
    e = b.add1("mul", [b.add1("exp", [b.add1("neg", [s])]), b.add1("tanh", [s])])  # s read twice
    b.output(e)
    g = b.graph
    verify(g)
    return g


def _fuse_all(g: Graph) -> None:
    for p in (RecognizeGelu(), FuseEpilogue(), FuseElementwise()):
        run_pass(p, g)


def test_reference_fused_equals_unfused() -> None:
    g = _zoo_graph()
    data = inputs_for(g)
    unfused = run_graph(g, data)[0]
    run_pass(RecognizeGelu(), g)
    before = run_graph(g, data)[0]
    assert relative_l2(before, unfused) <= 1e-6  # gelu's erfc form rounds differently from the written-out one
    run_pass(FuseEpilogue(), g)
    run_pass(FuseElementwise(), g)
    # conv + channel bias + residual + relu6; depthwise conv + hard_swish; matmul + bias + GELU (recognised);
    # gemm + sigmoid; and the elementwise tail reading the sigmoid twice
    assert ops_of(g) == ["fused_conv", "fused_conv", "reshape", "fused_matmul", "fused_gemm", "fused_elementwise"]
    assert relative_l2(run_graph(g, data)[0], before) == 0.0  # fused regions run the very same ops


def test_native_fused_matches_unfused(tmp_path: object) -> None:
    g = _zoo_graph()
    data = inputs_for(g)
    unfused = cuvil.compile(g, target="native", cache_dir=str(tmp_path))(*data)[0]
    _fuse_all(g)
    fused_model = cuvil.compile(g, target="native", cache_dir=str(tmp_path))
    fused = fused_model(*data)[0]
    ref = run_graph(g, data)[0]
    assert relative_l2(fused, unfused) <= 1e-6
    assert relative_l2(fused, ref) <= 1e-5


def test_native_fused_gelu_epilogue_and_symbolic_rows(tmp_path: object) -> None:
    """MatMul + bias + GELU (recognised) as one fused node, with a symbolic batch dim."""
    rng = np.random.default_rng(3)
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n", 1, 64)
    x = b.input("x", TensorType(F32, (sym("n"), 16)))
    m = b.add1("matmul", [x, b.constant(rng.standard_normal((16, 24)).astype(np.float32))])
    m = b.add1("add", [m, b.constant(rng.standard_normal(24).astype(np.float32))])
    half = b.add1("mul", [m, b.constant(np.float32(0.5))])
    erf = b.add1("erf", [b.add1("mul", [m, b.constant(np.float32(1 / math.sqrt(2)))])])
    b.output(b.add1("mul", [half, b.add1("add", [erf, b.constant(np.float32(1.0))])]))
    g = b.graph
    verify(g)
    data = [rng.standard_normal((5, 16)).astype(np.float32)]
    before = run_graph(g, data)[0]
    _fuse_all(g)
    assert ops_of(g) == ["fused_matmul"]
    (node,) = [n for n in g.nodes if n.op == "fused_matmul"]
    assert [n.op for n in node.attrs["epilogue"].nodes] == ["add", "gelu"]
    out = cuvil.compile(g, target="native", cache_dir=str(tmp_path))(*data)[0]
    assert relative_l2(run_graph(g, data)[0], before) <= 1e-6
    assert relative_l2(out, before) <= 1e-6

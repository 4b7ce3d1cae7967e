"""Constant folding's limits: result size, traits it never folds, one rule shared with the importer."""

from __future__ import annotations

import importlib

import numpy as np
import onnx
from onnx import TensorProto, helper

from cuvil.frontends.onnx import load_onnx
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.types import TensorType
from cuvil.ops.registry import NONDETERMINISTIC, OpDef, register, unregister
from cuvil.passes import FoldConstants, PassManager, VerifyEach
from cuvil.passes.fold_constants import fold_node


def test_results_above_the_cap_are_not_folded() -> None:
    # %w is read twice: folding exp(%w) would keep %w and add a second constant as large
    text = """graph main(%x: f32[4, 8]) {
  %w = constant() {value = dense<f32[8]> [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]} : f32[8]
  %e = exp(%w) : f32[8]
  %y = add(%x, %e) : f32[4, 8]
  %z = mul(%x, %w) : f32[4, 8]
  return %y, %z
}
"""
    small = FoldConstants(max_elements=7).run(parse_graph(text))
    assert not small.changed and "exp" in [n.op for n in small.graph.nodes]
    big = FoldConstants(max_elements=8).run(parse_graph(text))
    assert big.changed and "exp" not in [n.op for n in big.graph.nodes]


BIG_WEIGHT = """graph main(%x: f32[2, 4]) {
  %w = constant() {value = dense<f32[3, 4]> [0.5, -1.0, 2.0, 0.25, 1.5, 0.0, -0.5, 3.0, -2.0, 1.0, 0.75, -0.25]} : f32[3, 4]
  %wt = transpose(%w) {perm = [1, 0]} : f32[4, 3]
  %y = matmul(%x, %wt) : f32[2, 3]
  return %y
}
"""


def test_a_weight_read_only_by_the_node_folds_whatever_its_size() -> None:
    """A transposed weight replaces the weight: no constant bytes are added, and the transpose
    no longer runs on every call."""
    w = np.array([[0.5, -1.0, 2.0, 0.25], [1.5, 0.0, -0.5, 3.0], [-2.0, 1.0, 0.75, -0.25]], np.float32)
    g = FoldConstants(max_elements=4).run(parse_graph(BIG_WEIGHT)).graph
    assert [n.op for n in g.nodes] == ["constant", "constant", "matmul"]
    np.testing.assert_array_equal(g.nodes[1].attrs["value"], w.T)
    assert g.nodes[1].outputs[0].name == "wt"


def test_folding_that_would_add_constant_bytes_keeps_the_cap() -> None:
    cases = {
        # %w is also read by the gemm: folding keeps it and adds its negated copy
        "shared": BIG_WEIGHT.replace("%wt = transpose(%w) {perm = [1, 0]} : f32[4, 3]",
                                     "%wn = neg(%w) : f32[3, 4]").replace(
            "%y = matmul(%x, %wt) : f32[2, 3]\n  return %y",
            "%y = gemm(%x, %wn) {transB = 1} : f32[2, 3]\n  %v = gemm(%x, %w) {transB = 1} : f32[2, 3]\n"
            "  return %y, %v"),
        # %w is an output of the graph: it stays
        "output": BIG_WEIGHT.replace("%wt = transpose(%w) {perm = [1, 0]} : f32[4, 3]", "%wn = neg(%w) : f32[3, 4]").replace(
            "%y = matmul(%x, %wt) : f32[2, 3]", "%y = gemm(%x, %wn) {transB = 1} : f32[2, 3]").replace(
            "return %y", "return %y, %w"),
        # the result is larger than the weight it replaces
        "larger": BIG_WEIGHT.replace("%wt = transpose(%w) {perm = [1, 0]} : f32[4, 3]",
                                     "%wt = tile(%w, %reps) : f32[6, 4]").replace(
            "%y = matmul(%x, %wt) : f32[2, 3]", "%y = reduce_sum(%wt) : f32[]").replace(
            "%x: f32[2, 4]) {", "%x: f32[2, 4]) {\n  %reps = constant() {value = dense<i64[2]> [2, 1]} : i64[2]").replace(
            "return %y", "%u = add(%x, %y) : f32[2, 4]\n  return %u"),
    }
    for name, text in cases.items():
        g = FoldConstants(max_elements=4).run(parse_graph(text)).graph
        ops = [n.op for n in g.nodes]
        assert "neg" in ops or "tile" in ops, (name, ops)
        # above the cap by the number of elements alone, they fold
        unlimited = FoldConstants(max_elements=1000).run(parse_graph(text)).graph
        assert not {"neg", "tile"} & {n.op for n in unlimited.nodes}, name


def test_a_transposed_weight_folds_even_when_the_weight_is_read_as_it_is() -> None:
    """An embedding tied to the output layer: gathered from, and read transposed by a matmul.  The
    transpose would copy the whole weight on every call, so it folds into a second constant."""
    text = BIG_WEIGHT.replace("%y = matmul(%x, %wt) : f32[2, 3]\n  return %y",
                              "%y = matmul(%x, %wt) : f32[2, 3]\n  %r = gather(%w, %i) : f32[2, 4]\n  return %y, %r").replace(
        "%x: f32[2, 4]) {", "%x: f32[2, 4], %i: i64[2]) {")
    g = FoldConstants(max_elements=4).run(parse_graph(text)).graph
    assert [n.op for n in g.nodes] == ["constant", "constant", "matmul", "gather"], [n.op for n in g.nodes]


def test_control_flow_and_nondeterministic_ops_are_never_folded() -> None:
    text = """graph main(%x: f32[3]) {
  %c = constant() {value = dense<bool[]> [true]} : bool[]
  %a = constant() {value = dense<f32[3]> [1.0, 2.0, 3.0]} : f32[3]
  %y = if(%c) {then_branch = graph then_branch() {
      %t = neg(%a) : f32[3]
      return %t
    }, else_branch = graph else_branch() {
      %e = exp(%a) : f32[3]
      return %e
    }} : f32[3]
  return %y
}
"""
    g = FoldConstants().run(parse_graph(text)).graph
    assert [n.op for n in g.nodes] == ["constant", "constant", "if"]  # the branches' insides fold, the if stays
    register(OpDef(name="test.noise", inputs=("X",), infer=lambda ctx: [ctx.type(0)],
                   reference=lambda ctx: [ctx.input(0) + np.float32(np.random.rand())],
                   traits=frozenset({NONDETERMINISTIC})))
    try:
        b = Builder(Graph())
        x = b.input("x", TensorType(DType.f32, (3,)))
        noise = b.add1("test.noise", [b.constant(np.zeros(3, np.float32))])
        b.output(b.add1("add", [x, noise]))
        assert fold_node(b.graph.nodes[1]) is None
        assert not FoldConstants().run(b.graph).changed
    finally:
        unregister("test.noise")


def test_the_importer_folds_with_the_same_rule() -> None:
    assert importlib.import_module("cuvil.frontends.onnx.importer").fold_node is fold_node
    g = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    graph = load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op for n in graph.nodes] == ["constant", "reshape"]


def test_exported_shape_chains_collapse_around_a_symbolic_batch() -> None:
    """``x.reshape(-1, x.shape[1] * x.shape[2])`` as exporters write it (Shape -> Gather -> Mul ->
    Unsqueeze -> Concat -> Reshape): the importer cannot fold it (``x`` has a symbolic batch), the
    pass does, since the sizes it reads are static."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["d1"], axis=0),
        helper.make_node("Gather", ["s", "two"], ["d2"], axis=0),
        helper.make_node("Mul", ["d1", "d2"], ["inner"]),
        helper.make_node("Unsqueeze", ["inner", "axes"], ["inner1"]),
        helper.make_node("Concat", ["minus1", "inner1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [helper.make_tensor("one", TensorProto.INT64, [], [1]), helper.make_tensor("two", TensorProto.INT64, [], [2]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12])], inits)
    model: onnx.ModelProto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    imported = load_onnx(model)
    assert "shape" in [n.op for n in imported.nodes]
    folded = PassManager("fold-constants,dce", instruments=[VerifyEach()]).run(imported)
    assert [n.op for n in folded.nodes] == ["constant", "reshape"]
    np.testing.assert_array_equal(folded.nodes[0].attrs["value"], [-1, 12])

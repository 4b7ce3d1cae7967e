"""The seed models the mutators start from: a CNN (the bundled tiny CNN), an If model, a Loop model, an
attention block and a shape-arithmetic chain, each small, valid and importable."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.paths import REPO

OPSET = 18
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def tiny_cnn() -> onnx.ModelProto:
    return onnx.load(str(REPO / "cuvil" / "examples" / "tiny_cnn.onnx"))


def if_model() -> onnx.ModelProto:
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, ["n", 4])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, ["n", 4])])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    g = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("x", F, ["n", 4])],
                          [helper.make_tensor_value_info("y", F, ["n", 4])], [_const("zero", np.zeros((), np.float32))])
    return _model(g)


def loop_model() -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["v_in", "half"], ["v_out"]),
         helper.make_node("Add", ["v_out", "v_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v_out", F, [3]),
         helper.make_tensor_value_info("scan", F, [3])],
        [_const("half", np.full((3,), 0.5, np.float32))],
    )
    nodes = [helper.make_node("Loop", ["trips", "cond", "v0"], ["v", "scans"], body=body)]
    g = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("v0", F, [3])],
                          [helper.make_tensor_value_info("v", F, [3]), helper.make_tensor_value_info("scans", F, [4, 3])],
                          [_const("trips", np.array(4, np.int64)), _const("cond", np.array(True))])
    return _model(g)


def attention_block() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    d = 8
    inits = [_const(n, rng.standard_normal((d, d)).astype(np.float32)) for n in ("wq", "wk", "wv")]
    inits += [_const("scale", np.array(1 / np.sqrt(d), np.float32)), _const("perm_axes", np.array([0, 2, 1], np.int64))]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]),
        helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s"]),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    g = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", F, ["b", "s", d])],
                          [helper.make_tensor_value_info("y", F, ["b", "s", d])], inits)
    return _model(g)


def shape_chain() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "idx0"], ["n"], axis=0),
        helper.make_node("Concat", ["n", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["x", "newshape"], ["flat"]),
        helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["cut"]),
        helper.make_node("Unsqueeze", ["cut", "axes"], ["u"]),
        helper.make_node("Tile", ["u", "reps"], ["y"]),
    ]
    inits = [_const("idx0", np.array([0], np.int64)), _const("minus1", np.array([-1], np.int64)),
             _const("starts", np.array([1], np.int64)), _const("ends", np.array([5], np.int64)),
             _const("axes", np.array([1], np.int64)), _const("reps", np.array([1, 2, 1], np.int64))]
    g = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info("x", F, ["n", 2, 3])],
                          [helper.make_tensor_value_info("y", F, None)], inits)
    return _model(g)


SEEDS: dict[str, Callable[[], onnx.ModelProto]] = {
    "tiny_cnn": tiny_cnn, "if": if_model, "loop": loop_model, "attention": attention_block, "shapes": shape_chain,
}

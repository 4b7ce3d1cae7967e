"""Models the reduction tests cut down, built here as ONNX."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.verify.models import f32, onnx_model


def conv_tower(blocks: int = 6, strided_at: int = 3) -> onnx.ModelProto:
    """x[1,4,12,12] through ``blocks`` residual blocks (conv 3x3 -> relu -> add the block input, plus
    a side branch: sigmoid -> mul); block ``strided_at`` starts with a stride-2 convolution, the one
    conv the planted ``conv-stride`` fault breaks.  About 5 nodes a block, then a global pool."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    cur, size = "x", 12

    def weight(name: str, *shape: int) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name))
        return name

    for b in range(blocks):
        p = f"b{b}_"
        if b == strided_at:
            nodes.append(helper.make_node("Conv", [cur, weight(p + "ws", 4, 4, 3, 3)], [p + "down"], name=p + "down",
                                          strides=[2, 2], pads=[1, 1, 1, 1]))
            cur, size = p + "down", size // 2
        nodes += [
            helper.make_node("Conv", [cur, weight(p + "w", 4, 4, 3, 3), weight(p + "bias", 4)], [p + "c"],
                             name=p + "conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [p + "c"], [p + "r"], name=p + "relu"),
            helper.make_node("Sigmoid", [cur], [p + "g"], name=p + "gate"),
            helper.make_node("Mul", [p + "r", p + "g"], [p + "m"], name=p + "mul"),
            helper.make_node("Add", [p + "m", cur], [p + "out"], name=p + "add"),
        ]
        cur = p + "out"
    nodes.append(helper.make_node("GlobalAveragePool", [cur], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["y"], name="flatten"))
    return onnx_model(nodes, [f32("x", [1, 4, 12, 12])], [f32("y", [1, 4])], inits)


def argmax_chain() -> onnx.ModelProto:
    """x[4,16] -> log -> mul -> add -> ArgMax(axis 1) -> cast to float -> mul -> add -> y[4], with a
    side branch (x -> sigmoid -> reduce-sum -> mul) added in.  The log of a negative entry is NaN, and
    onnxruntime's ArgMax skips a NaN where the reference (NumPy) picks it: the one op the two disagree on."""
    rng = np.random.default_rng(1)

    def const(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) + 1.0).astype(np.float32), name)

    inits = [const("k1", 16), const("k2", 16), const("k3", 4), numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [
        helper.make_node("Log", ["x"], ["r"], name="log"),
        helper.make_node("Mul", ["r", "k1"], ["m"], name="mul"),
        helper.make_node("Add", ["m", "k2"], ["a"], name="add"),
        helper.make_node("ArgMax", ["a"], ["i"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Cast", ["i"], ["f"], name="cast", to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["f", "k3"], ["g"], name="scale"),
        helper.make_node("Sigmoid", ["x"], ["s"], name="gate"),
        helper.make_node("ReduceSum", ["s", "ax"], ["t"], name="sum", keepdims=0),
        helper.make_node("Mul", ["t", "k3"], ["u"], name="side"),
        helper.make_node("Add", ["g", "u"], ["y"], name="out"),
    ]
    return onnx_model(nodes, [f32("x", [4, 16])], [f32("y", [4])], inits)


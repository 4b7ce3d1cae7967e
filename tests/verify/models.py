"""What the verification tests share: small ONNX models built in the test, a verification
context over one, and running one check on it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import cuvil.verify.checks  # noqa: F401  (registers the checks)
from cuvil.verify.base import CheckResult, get_check
from cuvil.verify.context import ModelSource, VerifyContext


def f32(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def onnx_model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
               inits: Sequence[onnx.TensorProto] = ()) -> onnx.ModelProto:
    """A model of one graph ``m``, opset 17."""
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def residual_softmax() -> onnx.ModelProto:
    """a = exp(x); b = softmax(a); c = softmax(b * k); y = c + a: ``a`` is read twice, so it lives long."""
    k = numpy_helper.from_array(np.linspace(0.5, 2.0, 64, dtype=np.float32).reshape(1, 64), "k")
    nodes = [helper.make_node("Exp", ["x"], ["a"], name="exp"),
             helper.make_node("Softmax", ["a"], ["b"], name="sm1"),
             helper.make_node("Mul", ["b", "k"], ["m"], name="scale"),
             helper.make_node("Softmax", ["m"], ["c"], name="sm2"),
             helper.make_node("Add", ["c", "a"], ["y"], name="residual")]
    return onnx_model(nodes, [f32("x", [4, 64])], [f32("y", [4, 64])], [k])


def if_on_sum(threshold: float = 5.0) -> onnx.ModelProto:
    """y = x + x if sum(x * x) > threshold else x - 1: the condition depends on a float input."""
    consts = (numpy_helper.from_array(np.array(threshold, np.float32), "limit"),
              numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"], name="dbl")], "then", [], [f32("t", [4])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"], name="dec")], "else", [],
                               [f32("e", [4])])
    nodes = [helper.make_node("ReduceSumSquare", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "limit"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="big", then_branch=then_g, else_branch=else_g)]
    return onnx_model(nodes, [f32("x", [4])], [f32("y", [4])], consts)


def context(model: object, targets: list[str], tmp_path: Path, cache: str, kind: str = "onnx") -> VerifyContext:
    return VerifyContext(ModelSource(kind, model), targets, work_dir=tmp_path, cache_dir=cache)


def run(name: str, ctx: VerifyContext, **options: object) -> dict[str, CheckResult]:
    """The check's results by target (``""`` for a result of no target)."""
    return {r.target or "": r for r in get_check(name)(options).run(ctx)}

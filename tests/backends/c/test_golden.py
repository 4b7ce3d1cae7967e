"""Generated C of a few tiny models, kept as golden files and diffed on every change.

After an intended change to code generation, rewrite them with
``python -m pytest tests/backends/c/test_golden.py --update-golden`` and
review the diff.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.backends.c.codegen import CodegenOptions, generate
from cuvil.frontends.onnx import load_onnx

GOLDEN = Path(__file__).parent / "golden"


def _model(nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "tiny", ins, outs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def add_relu() -> onnx.ModelProto:
    """Broadcasting add and a relu over a symbolic batch."""
    return _model(
        [helper.make_node("Add", ["x", "b"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")],
    )


def matmul_softmax() -> onnx.ModelProto:
    """A linear layer and a softmax."""
    w = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
    return _model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
         helper.make_node("Softmax", ["h"], ["p"], name="softmax", axis=-1)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(w, "w")],
    )


def branch() -> onnx.ModelProto:
    """An If whose branches negate or double the input."""
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["e"], name="double")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    return _model(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )


@pytest.mark.parametrize("build", [add_relu, matmul_softmax, branch], ids=lambda f: f.__name__)
def test_generated_c_matches_golden(build: object, update_golden: bool) -> None:
    assert callable(build)
    source = generate(load_onnx(build()), CodegenOptions(target="generic", model_name="tiny")).source
    path = GOLDEN / f"{build.__name__}.c"
    if update_golden:
        path.write_text(source, encoding="utf-8")
    assert path.is_file(), f"{path.name} is missing: run with --update-golden"
    assert source == path.read_text(encoding="utf-8"), f"generated C differs from {path.name}"

"""Every op the reference interpreter supports has a C kernel; the x86 targets build and agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
import cuvil.ops
from cuvil.backends.c.kernel import kernel_ops
from tests.support.targets import runnable

HANDLED_BY_CODEGEN = {"constant", "if", "loop"}  # weights, and regions emitted inline


def test_every_op_has_a_c_kernel() -> None:
    import cuvil.backends.c.kernels

    missing = sorted(set(cuvil.ops.all_ops()) - kernel_ops() - HANDLED_BY_CODEGEN)
    assert not missing, f"ops without a C kernel: {missing}"


@pytest.mark.parametrize("target", runnable("generic", "x86_avx2", "x86_avx512", "native"))
def test_targets_build_and_agree(target: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    fc = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "fc")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["l"]),
        helper.make_node("Softmax", ["l"], ["y"], axis=-1),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 9, 9])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], [w, fc])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m = cuvil.compile(model, target=target, cache_dir=str(tmp_path))
    assert m.build_info.warnings == ""  # type: ignore[union-attr]
    ref = cuvil.compile(model, target="ref")
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 9, 9)).astype(np.float32)
        np.testing.assert_allclose(m(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)

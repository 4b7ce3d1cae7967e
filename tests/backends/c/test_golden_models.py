"""The C that users get for two tiny models, kept as golden files: the whole default pipeline
(fusion, the memory plan, channels-last convolutions) and code generation, as ``cuvil.compile``
runs them for ``x86_avx2``, so that a change to any pass or kernel emitter shows in review as a
diff of ``golden/<model>.x86_avx2.c``.

The models: the bundled example ``cuvil/examples/tiny_cnn.onnx`` (convolutions with fused
epilogues, a max pool, a classifier head), and a mobile block with an MLP head built here (1x1
and depthwise convolutions that ``convert-layout`` moves to NHWC, a residual add, a global pool,
two linear layers and a softmax).  The weights live in ``weights.bin``, not in the C, and the C
names no path of this machine: the files are the same wherever they are generated.

After an intended change, rewrite them with
``python -m pytest tests/backends/c/test_golden_models.py --update-golden`` and review the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from tests.support.paths import REPO

GOLDEN = Path(__file__).parent / "golden"
TARGET = "x86_avx2"  # a fixed instruction set: "native" would generate for this machine's CPU


def mobile_mlp() -> onnx.ModelProto:
    """An inverted residual block (expand 1x1, ReLU6, depthwise 3x3, ReLU6, project 1x1, residual)
    over a symbolic batch of 16x12x12 images, then a global average pool and a 16-32-10 MLP with a
    softmax."""
    rng = np.random.default_rng(0)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    inits = [w("we", 48, 16, 1, 1), w("be", 48), w("wd", 48, 1, 3, 3), w("bd", 48), w("wp", 16, 48, 1, 1),
             w("bp", 16), w("w1", 16, 32), w("b1", 32), w("w2", 32, 10), w("b2", 10),
             numpy_helper.from_array(np.float32(0.0), "lo"), numpy_helper.from_array(np.float32(6.0), "hi")]
    nodes = [
        helper.make_node("Conv", ["x", "we", "be"], ["e"], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["er"], name="expand_relu6"),
        helper.make_node("Conv", ["er", "wd", "bd"], ["d"], name="depthwise", group=48, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["dr"], name="depthwise_relu6"),
        helper.make_node("Conv", ["dr", "wp", "bp"], ["p"], name="project"),
        helper.make_node("Add", ["x", "p"], ["r"], name="residual"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="pool"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w1", "b1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["hr"], name="fc1_relu"),
        helper.make_node("Gemm", ["hr", "w2", "b2"], ["z"], name="fc2"),
        helper.make_node("Softmax", ["z"], ["y"], name="softmax", axis=-1),
    ]
    g = helper.make_graph(nodes, "mobile_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              ["batch", 16, 12, 12])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {
    "tiny_cnn": lambda: str(REPO / "cuvil" / "examples" / "tiny_cnn.onnx"),
    "mobile_mlp": mobile_mlp,
}


@pytest.mark.slow  # two compiles through the C compiler
@pytest.mark.parametrize("name", sorted(MODELS))
def test_generated_c_after_the_default_pipeline_matches_golden(name: str, tmp_path: Path,
                                                               update_golden: bool) -> None:
    m = cuvil.compile(MODELS[name](), target=TARGET, cache_dir=str(tmp_path))
    assert m.build_info is not None
    source = m.build_info.source.read_text(encoding="utf-8")
    path = GOLDEN / f"{name}.{TARGET}.c"
    if update_golden:
        path.write_text(source, encoding="utf-8")
    assert path.is_file(), f"{path.name} is missing: run with --update-golden"
    assert source == path.read_text(encoding="utf-8"), f"generated C differs from {path.name}: review the diff, " \
        "then rewrite it with --update-golden"
    # what makes the file reviewable and the same on every machine
    assert str(tmp_path) not in source and str(REPO) not in source and "/home/" not in source
    assert not re.search(r"\d\.\d{5,}", source), "weights (long float literals) in the generated C"
    # the default pipeline ran: epilogues fused, intermediates planned into one arena, and for the
    # mobile block its convolutions channels-last
    ops = {n.op for n in m.graph.nodes}
    assert "/* memory plan: " in source and "fused node" in source
    if name == "mobile_mlp":
        assert {"fused_conv_nhwc", "fused_gemm"} <= ops, ops

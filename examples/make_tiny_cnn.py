"""Builds the bundled example model ``cuvil/examples/tiny_cnn.onnx``.

A small image classifier written directly with ``onnx.helper`` (no
framework needed): Conv -> BatchNormalization -> Relu -> MaxPool -> Conv ->
Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax, with a symbolic
batch dimension. Weights come from a fixed seed, so the file is reproducible.

    python examples/make_tiny_cnn.py [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build() -> onnx.ModelProto:
    rng = np.random.default_rng(20261129)

    def w(name: str, *shape: int, scale: float = 0.2) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        w("conv1.w", 8, 3, 3, 3),
        w("conv1.b", 8),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(8)).astype(np.float32), "bn.scale"),
        w("bn.bias", 8, scale=0.1),
        w("bn.mean", 8, scale=0.1),
        numpy_helper.from_array((0.5 + rng.random(8)).astype(np.float32), "bn.var"),
        w("conv2.w", 16, 8, 3, 3),
        w("conv2.b", 16),
        w("fc.w", 10, 16),
        w("fc.b", 10),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.w", "conv1.b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b1"],
                         name="bn1", epsilon=1e-5),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        inits,
    )
    model = helper.make_model(graph, producer_name="cuvil-examples", opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1] / "cuvil" / "examples" / "tiny_cnn.onnx")
    onnx.save(build(), str(out))
    print(f"wrote {out}")

"""The float32 convolution over chunks of output rows (runtime/cuvil_conv_tiled.h).

Shapes are chosen so that images split into several chunks (a chunk's im2col columns are capped
in size): a 7x7 stride-2 stem, a grouped strided 3x3, a 1x1 (no im2col) and a strided 1x1, 1-D and
3-D convolutions, batch 2.  Each is checked against the reference interpreter, with its fused
epilogue (ReLU, a residual add read at the tile's offset) applied on each finished tile, and one
and two threads must give the same bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import cuvil
from cuvil.passes.manager import default_pipeline
from tests.support.c_conv_kernels import make_model, randn, vi


def weight(name: str, *shape: int) -> object:
    """Weights scaled by 1/sqrt(fan-in), so outputs stay near unit size at every depth."""
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return numpy_helper.from_array(randn(*shape) / np.float32(np.sqrt(fan_in)), name)


def _model() -> tuple[object, list[np.ndarray]]:
    inits = [weight("w7", 24, 16, 7, 7), weight("b7", 24), weight("wg", 24, 12, 3, 3), weight("w1", 24, 24, 1, 1),
             weight("ws", 8, 24, 1, 1), weight("w1d", 6, 5, 9), weight("w3d", 4, 3, 3, 3, 3)]
    nodes = [
        helper.make_node("Conv", ["x", "w7", "b7"], ["c7"], kernel_shape=[7, 7], strides=[2, 2], pads=[3, 3, 3, 3]),
        helper.make_node("Relu", ["c7"], ["r7"]),
        helper.make_node("Conv", ["r7", "wg"], ["cg"], kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 1, 1],
                         group=2),
        helper.make_node("Conv", ["r7", "w1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Add", ["c1", "r7"], ["a1"]),  # a residual: fused, read at each tile's offset
        helper.make_node("Relu", ["a1"], ["y1"]),
        helper.make_node("Conv", ["y1", "ws"], ["cs"], kernel_shape=[1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["v", "w1d"], ["c1d"], kernel_shape=[9], strides=[3], pads=[4, 2]),
        helper.make_node("Conv", ["u", "w3d"], ["c3d"], kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1]),
    ]
    inputs = [vi("x", T.FLOAT, [2, 16, 90, 70]), vi("v", T.FLOAT, [2, 5, 3000]), vi("u", T.FLOAT, [1, 3, 20, 24, 28])]
    model = make_model(nodes, inputs, ["r7", "cg", "y1", "cs", "c1d", "c3d"], inits)
    return model, [randn(2, 16, 90, 70), randn(2, 5, 3000), randn(1, 3, 20, 24, 28)]


# The default pipeline without the NHWC layout pass, which would take these convolutions.
NCHW = default_pipeline("native").replace("convert-layout,", "")


def test_tiled_conv_matches_reference_with_epilogues(tmp_path: Path) -> None:
    model, feeds = _model()
    c = cuvil.compile(model, target="native", passes=NCHW, cache_dir=str(tmp_path))
    source = c.build_info.source.read_text()  # type: ignore[union-attr]
    assert source.count("cuvil_conv_tiled_f32(&") == 6
    assert source.count("cuvil_conv_tiled_f32(&") - source.count(", NULL);") >= 2  # two fused epilogues
    ref = cuvil.compile(model, target="ref")
    for got, want in zip(c(*feeds), ref(*feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tiled_conv_is_bitwise_the_same_for_any_thread_count(tmp_path: Path) -> None:
    model, feeds = _model()
    one = cuvil.compile(model, target="native", passes=NCHW, num_threads=1, cache_dir=str(tmp_path))
    two = cuvil.compile(model, target="native", passes=NCHW, num_threads=2, cache_dir=str(tmp_path))
    for a, b in zip(one(*feeds), two(*feeds)):
        assert a.tobytes() == b.tobytes()

"""Convolution C kernels (conv, conv_transpose) and cuvil_sgemm against the reference interpreter.

Symbolic batch and image dims run at two shapes; groups, depthwise, dilations, strides, SAME
padding, 1x1 (the no-im2col path), 1-D and 3-D, f64 and f16; the run-time shape checks (with
their messages).  Builds must compile without warnings on the generic and native targets.
The helpers are tests/support/c_conv_kernels.py, shared with the pooling and resize kernel tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from tests.support.c_conv_kernels import compare, fails, make_model, randn, vi, weight

# conv --------------------------------------------------------------------------------------


def _conv_model(elem: int, dtype: type[np.generic]) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w3", "b8"], ["y_3x3"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["x", "w1"], ["y_1x1"]),
        helper.make_node("Conv", ["x", "wg"], ["y_group"], group=2, dilations=[2, 1], auto_pad="SAME_UPPER"),
        helper.make_node("Conv", ["x", "wd", "b8"], ["y_depthwise"], group=4, pads=[1, 0, 2, 1], strides=[1, 2]),
        helper.make_node("Conv", ["x", "wv"], ["y_valid"], auto_pad="SAME_LOWER", strides=[3, 2]),
    ]
    inits = [
        weight("w3", 8, 4, 3, 3, dtype=dtype), weight("b8", 8, dtype=dtype), weight("w1", 6, 4, 1, 1, dtype=dtype),
        weight("wg", 6, 2, 3, 2, dtype=dtype), weight("wd", 8, 1, 3, 3, dtype=dtype),
        weight("wv", 5, 4, 2, 3, dtype=dtype),
    ]
    outs = ["y_3x3", "y_1x1", "y_group", "y_depthwise", "y_valid"]
    return make_model(nodes, [vi("x", elem, ["n", 4, "h", "w"])], outs, inits)


@pytest.mark.parametrize("target", ["generic", "native"])
def test_conv_2d_variants_symbolic(tmp_path: Path, target: str) -> None:
    model = _conv_model(T.FLOAT, np.float32)
    compare(model, [[randn(1, 4, 9, 11)], [randn(2, 4, 16, 5)]], tmp_path, target=target)


def test_conv_f64_and_f16(tmp_path: Path) -> None:
    compare(_conv_model(T.DOUBLE, np.float64), [[randn(2, 4, 7, 8, dtype=np.float64)]], tmp_path, rtol=1e-12,
            atol=1e-12)
    compare(_conv_model(T.FLOAT16, np.float16), [[randn(1, 4, 6, 9, dtype=np.float16)]], tmp_path, rtol=2e-3,
            atol=2e-3)


def test_conv_1d_3d_and_transpose(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Conv", ["x1", "w1d"], ["c1"], pads=[2, 1], dilations=[2], strides=[2]),
        helper.make_node("Conv", ["x3", "w3d", "b3"], ["c3"], pads=[1, 0, 1, 1, 0, 1], group=3),
        helper.make_node("ConvTranspose", ["x2", "wt", "bt"], ["t_plain"], strides=[2, 2], pads=[1, 0, 0, 1]),
        helper.make_node("ConvTranspose", ["x2", "wtg"], ["t_group"], group=2, strides=[2, 3], dilations=[1, 2],
                         output_padding=[1, 0]),
        helper.make_node("ConvTranspose", ["x2", "wt"], ["t_same"], strides=[2, 2], auto_pad="SAME_UPPER"),
        helper.make_node("ConvTranspose", ["x2", "wt"], ["t_shape"], strides=[3, 2], output_shape=[14, 12]),
    ]
    inits = [
        weight("w1d", 3, 2, 3), weight("w3d", 6, 1, 2, 3, 2), weight("b3", 6),
        weight("wt", 4, 3, 3, 3), weight("bt", 3), weight("wtg", 4, 2, 2, 3),
    ]
    inputs = [vi("x1", T.FLOAT, [1, 2, "l"]), vi("x3", T.FLOAT, [2, 3, 4, 5, 6]), vi("x2", T.FLOAT, [1, 4, 5, 6])]
    model = make_model(nodes, inputs, ["c1", "c3", "t_plain", "t_group", "t_same", "t_shape"], inits)
    compare(model, [[randn(1, 2, 13), randn(2, 3, 4, 5, 6), randn(1, 4, 5, 6)],
                    [randn(1, 2, 6), randn(2, 3, 4, 5, 6), randn(1, 4, 5, 6)]], tmp_path)


def test_conv_run_time_checks(tmp_path: Path) -> None:
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3])]
    inputs = [vi("x", T.FLOAT, [1, "c", 5, 5]), vi("w", T.FLOAT, [4, "cw", "kh", 3]), vi("b", T.FLOAT, ["m"])]
    model = make_model(nodes, inputs, ["y"])
    c = compare(model, [[randn(1, 2, 5, 5), randn(4, 2, 3, 3), randn(4)]], tmp_path)
    fails(c, [randn(1, 3, 5, 5), randn(4, 2, 3, 3), randn(4)], "input channels and weight channels x group differ: 3 != 2")
    fails(c, [randn(1, 2, 5, 5), randn(4, 2, 2, 3), randn(4)], "weight spatial dim 0 and kernel_shape differ: 2 != 3")
    fails(c, [randn(1, 2, 5, 5), randn(4, 2, 3, 3), randn(5)], "bias length and output channels differ: 5 != 4")


def test_resnet_like_block_native(tmp_path: Path) -> None:
    """Large enough that every GEMM has several K, M and N blocks and partial edge tiles."""
    nodes = [
        helper.make_node("Conv", ["x", "w7"], ["s"], pads=[3, 3, 3, 3], strides=[2, 2]),
        helper.make_node("Conv", ["s", "w3"], ["y"], pads=[1, 1, 1, 1]),
    ]
    inits = [weight("w7", 70, 3, 7, 7), weight("w3", 130, 70, 3, 3)]
    model = make_model(nodes, [vi("x", T.FLOAT, [1, 3, 58, 62])], ["y"], inits)
    compare(model, [[randn(1, 3, 58, 62)]], tmp_path, target="native", rtol=1e-4, atol=1e-2)  # |y| ~ 500

"""The resize C kernel against the reference interpreter.

Every interpolation mode with the coordinate transformations, antialiasing, exclude_outside,
cubic_coeff_a, tf_crop_and_resize extrapolation, keep_aspect_ratio_policy and axes; scales and
sizes as constants (inference sizes the output) and at run time (the kernel does); integer
outputs (rounded and saturated) and f16; the run-time checks' messages.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper

from tests.support.c_conv_kernels import compare, fails, make_model, randn, vi


def _f32(*v: float) -> np.ndarray:
    return np.array(v, dtype=np.float32)


def test_resize_modes_constant_scales(tmp_path: Path) -> None:
    up = helper.make_tensor("up", T.FLOAT, [4], [1, 1, 2, 1.5])
    down = helper.make_tensor("down", T.FLOAT, [4], [1, 1, 0.6, 0.5])
    sizes = helper.make_tensor("sizes", T.INT64, [2], [5, 3])
    roi = helper.make_tensor("roi", T.FLOAT, [8], [0, 0, 0.1, 0.2, 1, 1, 0.9, 1.2])
    node = helper.make_node
    nodes = [
        node("Resize", ["x", "", "up"], ["n_hp"], mode="nearest"),
        node("Resize", ["x", "", "up"], ["n_ac"], mode="nearest", coordinate_transformation_mode="align_corners",
             nearest_mode="floor"),
        node("Resize", ["x", "", "down"], ["n_as"], mode="nearest", coordinate_transformation_mode="asymmetric",
             nearest_mode="ceil"),
        node("Resize", ["x", "", "up"], ["l_hp"], mode="linear"),
        node("Resize", ["x", "", "down"], ["l_aa"], mode="linear", antialias=1),
        node("Resize", ["x", "", "up"], ["l_sym"], mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
        node("Resize", ["x", "", "down"], ["c_ex"], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5),
        node("Resize", ["x", "", "down"], ["c_aa"], mode="cubic", antialias=1),
        node("Resize", ["x", "", "up"], ["c_pt"], mode="cubic", coordinate_transformation_mode="pytorch_half_pixel"),
        node("Resize", ["x", "roi", "up"], ["tf"], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
             extrapolation_value=-3.0),
        node("Resize", ["x", "", "", "sizes"], ["s_nl"], mode="nearest", axes=[3, 2],
             keep_aspect_ratio_policy="not_larger"),
        node("Resize", ["x", "", "", "sizes"], ["s_ns"], mode="linear", axes=[2, 3],
             keep_aspect_ratio_policy="not_smaller"),
    ]
    outs = [n.output[0] for n in nodes]
    model = make_model(nodes, [vi("x", T.FLOAT, [1, 2, 5, 6])], outs, [up, down, sizes, roi])
    compare(model, [[randn(1, 2, 5, 6)]], tmp_path)


def test_resize_run_time_scales_sizes_and_types(tmp_path: Path) -> None:
    node = helper.make_node
    nodes = [
        node("Resize", ["x", "", "sc"], ["ys"], mode="linear"),
        node("Resize", ["x", "", "", "sz"], ["yz"], mode="cubic", axes=[2, 3]),
        node("Resize", ["u", "", "", "sz"], ["yu"], mode="cubic", axes=[1, 2]),
        node("Resize", ["h", "", "sc"], ["yh"], mode="nearest", nearest_mode="round_prefer_ceil"),
    ]
    inputs = [vi("x", T.FLOAT, [1, 1, "h", "w"]), vi("sc", T.FLOAT, ["k"]), vi("sz", T.INT64, [2]),
              vi("u", T.UINT8, [3, 4, 5]), vi("h", T.FLOAT16, [1, 1, 3, 4])]
    model = make_model(nodes, inputs, ["ys", "yz", "yu", "yh"])
    u = np.random.default_rng(2).integers(0, 256, (3, 4, 5)).astype(np.uint8)
    h = randn(1, 1, 3, 4, dtype=np.float16)
    c = compare(model, [
        [randn(1, 1, 4, 5), _f32(1, 1, 1.7, 0.8), np.array([7, 3], np.int64), u, h],
        [randn(1, 1, 6, 3), _f32(1, 1, 0.5, 2.25), np.array([2, 9], np.int64), u, h],
    ], tmp_path)
    fails(c, [randn(1, 1, 4, 5), _f32(1, 1, -1, 1), np.array([7, 3], np.int64), u, h], "scales must be positive")
    fails(c, [randn(1, 1, 4, 5), _f32(1, 1, 2), np.array([7, 3], np.int64), u, h],
          "scales length vs number of resized axes: 3 != 4")
    fails(c, [randn(1, 1, 4, 5), _f32(1, 1, 1, 1), np.array([-1, 3], np.int64), u, h], "sizes must be non-negative")

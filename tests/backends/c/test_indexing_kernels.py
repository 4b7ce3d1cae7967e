"""Indexing C kernels against the reference interpreter.

gather, gather_elements, scatter_elements (every reduction), gather_nd,
scatter_nd, one_hot and non_zero, with symbolic dims run at two shapes,
negative indices, several element types, and the run-time index checks
(an out-of-range index fails the call with its value, never touches memory).
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from tests.support.c_shape_kernels import RNG, compare, const, fails, make_model, randn, vi


def test_gather_family(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Gather", ["x", "i"], ["g0"], axis=0),
        helper.make_node("Gather", ["x", "j"], ["g1"], axis=-1),
        helper.make_node("GatherElements", ["x", "e"], ["ge"], axis=1),
        helper.make_node("GatherND", ["x", "nd"], ["gn"]),
        helper.make_node("GatherND", ["x", "nb"], ["gb"], batch_dims=1),
    ]
    m = make_model(nodes, [vi("x", T.FLOAT16, ["n", 5]), vi("i", T.INT64, [2, "k"]), vi("j", T.INT32, ["k"]),
                           vi("e", T.INT64, ["m", 3]), vi("nd", T.INT64, ["k", 2]), vi("nb", T.INT64, ["p", 1])],
                   ["g0", "g1", "ge", "gn", "gb"])

    def feed(n: int, k: int, mm: int) -> list[np.ndarray]:
        return [randn(n, 5, dtype=np.float16), RNG.integers(-n, n, (2, k)), RNG.integers(-5, 5, k).astype(np.int32),
                RNG.integers(-5, 5, (mm, 3)), np.stack([RNG.integers(-n, n, k), RNG.integers(-5, 5, k)], 1),
                RNG.integers(-5, 5, (n, 1))]

    c = compare(m, [feed(4, 3, 2), feed(1, 6, 1), feed(3, 0, 0)], tmp_path)
    good = feed(4, 3, 2)
    bad = list(good)
    bad[1] = np.array([[0, 1, 4], [0, 0, 0]])
    fails(c, bad, "index 4 is out of range for axis 0 of size 4")
    bad = list(good)
    bad[2] = np.array([0, -6, 1], np.int32)
    fails(c, bad, "index -6 is out of range for axis 1 of size 5")
    bad = list(good)
    bad[3] = np.array([[0, 0, 0], [0, 5, 0]])
    fails(c, bad, "index 5 is out of range for axis 1")
    bad = list(good)
    bad[3] = np.zeros((5, 3), np.int64)
    fails(c, bad, "indices dims exceed the data dims")
    bad = list(good)
    bad[4] = np.array([[0, 0], [-5, 0], [0, 0]])
    fails(c, bad, "index -5 is out of range for axis 0 of size 4")
    bad = list(good)
    bad[5] = np.zeros((3, 1), np.int64)
    fails(c, bad, "batch dim 0 of indices and data")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's NumPy on NaN
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.uint8, np.bool_, ml_dtypes.bfloat16])
def test_scatter_reductions(tmp_path: Path, dtype: type) -> None:
    elem = {np.float32: T.FLOAT, np.int32: T.INT32, np.int64: T.INT64, np.uint8: T.UINT8, np.bool_: T.BOOL,
            ml_dtypes.bfloat16: T.BFLOAT16}[dtype]
    nodes = []
    outs = []
    for red in ("none", "add", "mul", "max", "min"):
        nodes.append(helper.make_node("ScatterElements", ["x", "e", "u"], [f"se_{red}"], axis=0, reduction=red))
        nodes.append(helper.make_node("ScatterND", ["x", "nd", "un"], [f"sn_{red}"], reduction=red))
        outs += [f"se_{red}", f"sn_{red}"]
    m = make_model(nodes, [vi("x", elem, ["n", 4]), vi("e", T.INT64, ["m", 4]), vi("u", elem, ["m", 4]),
                           vi("nd", T.INT64, ["k", 1]), vi("un", elem, ["q", 4])], outs)

    def data(*shape: int) -> np.ndarray:
        if dtype == np.bool_:
            return RNG.integers(0, 2, shape).astype(np.bool_)
        if np.dtype(dtype).kind in "iu":
            dt = np.dtype(dtype)
            big = (1 << (8 * dt.itemsize - (dt.kind == "i"))) - 1
            return RNG.integers(0, big, shape, endpoint=True).astype(dtype)  # products and sums wrap
        x: np.ndarray = RNG.standard_normal(shape).astype(dtype)
        x.reshape(-1)[:1] = np.nan
        return x

    def feed(n: int, mm: int, k: int) -> list[np.ndarray]:
        return [data(n, 4), RNG.integers(-n, n, (mm, 4)), data(mm, 4), RNG.integers(-n, n, (k, 1)), data(k, 4)]

    c = compare(m, [feed(3, 5, 6), feed(1, 2, 3)], tmp_path)
    bad = feed(3, 5, 6)
    bad[4] = data(5, 4)
    fails(c, bad, "updates dim 0")
    bad = feed(3, 5, 6)
    bad[3] = np.full((6, 1), -4)
    fails(c, bad, "index -4 is out of range for axis 0 of size 3")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy casting NaN indices
def test_one_hot_non_zero(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("OneHot", ["i", "d", "v"], ["o"], axis=1),
        helper.make_node("OneHot", ["f", "cd", "v"], ["of"]),
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("NonZero", ["s"], ["nzs"]),
    ]
    m = make_model(nodes, [vi("i", T.INT32, ["a", 3]), vi("d", T.FLOAT, []), vi("v", T.FLOAT16, [2]),
                           vi("f", T.FLOAT, ["b"]), vi("x", T.FLOAT16, ["a", 3, 2]), vi("s", T.INT8, [])],
                   ["o", "of", "nz", "nzs"], [const("cd", [4])])
    v = np.array([-1.5, 2.0], np.float16)

    def feed(a: int, depth: float, s: int) -> list[np.ndarray]:
        x = randn(a, 3, 2, dtype=np.float16)
        x[x < 0.3] = 0
        return [RNG.integers(-6, 6, (a, 3)).astype(np.int32), np.array(depth, np.float32), v,
                np.array([0.5, -1.7, 3.9, 4.0, -4.0, -5.2, np.nan, np.inf], np.float32), x, np.array(s, np.int8)]

    c = compare(m, [feed(2, 5.7, 3), feed(1, 0.0, 0), feed(0, 3.0, -1)], tmp_path)
    fails(c, feed(2, -1.0, 1), "depth -1 must not be negative")
    fails(c, feed(2, np.nan, 1), "depth \\(nan\\) is not a finite integer")

"""Shape, layout and generation C kernels against the reference interpreter.

Covers reshape, flatten, squeeze, unsqueeze, transpose, expand, shape, size,
concat, split, slice, tile, trilu, constant_of_shape, eye_like and range:
symbolic dims run at two shapes, shape operands given at run time (so the
kernels compute output dims in C), several element types, and the run-time
checks (each failure's message is asserted).  Every build must compile
without warnings; each test compiles one model holding many ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper

from tests.support.c_shape_kernels import RNG, compare, const, fails, i64, make_model, randn, vi

# helpers (shared with test_indexing_kernels) -----------------------------------------


# layout ops ------------------------------------------------------------------------------


def test_reshape_family_runtime_shapes(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["r"]),
        helper.make_node("Reshape", ["x", "c"], ["r2"]),
        helper.make_node("Reshape", ["z", "sz"], ["rz"], allowzero=1),
        helper.make_node("Flatten", ["x"], ["f"], axis=2),
        helper.make_node("Unsqueeze", ["x", "ua"], ["u"]),
        helper.make_node("Squeeze", ["u", "sa"], ["q"]),
        helper.make_node("Squeeze", ["u", "ca"], ["q2"]),
        helper.make_node("Shape", ["x"], ["sh"], start=1),
        helper.make_node("Size", ["x"], ["n"]),
    ]
    m = make_model(nodes, [vi("x", T.FLOAT16, ["b", 3, "w"]), vi("s", T.INT64, [3]), vi("z", T.INT32, [0, 3]),
                           vi("sz", T.INT64, [2]), vi("ua", T.INT64, [2]), vi("sa", T.INT64, [1])],
                   ["r", "r2", "rz", "f", "u", "q", "q2", "sh", "n"], [const("c", [0, -1]), const("ca", [0])])
    feeds = [
        [randn(2, 3, 4, dtype=np.float16), i64(0, -1, 2), np.zeros((0, 3), np.int32), i64(3, 0), i64(0, -1),
         i64(0)],
        [randn(1, 3, 5, dtype=np.float16), i64(5, 3, 1), np.zeros((0, 3), np.int32), i64(0, 7), i64(3, 1),
         i64(-4)],
    ]
    c = compare(m, feeds, tmp_path)
    x, z = feeds[0][0], feeds[0][2]
    fails(c, [x, i64(5, -1, 1), z, i64(3, 0), i64(0, -1), i64(0)], "cannot reshape 24 elements")
    fails(c, [x, i64(-1, -1, 2), z, i64(3, 0), i64(0, -1), i64(0)], "more than one -1")
    fails(c, [x, i64(0, -1, 2), z, i64(3, 0), i64(0, 0), i64(0)], "repeated axis")
    fails(c, [x, i64(0, -1, 2), z, i64(3, 0), i64(0, 5), i64(0)], "axis 5 is out of range")
    fails(c, [x, i64(0, -1, 2), z, i64(3, 0), i64(0, -1), i64(2)], "cannot squeeze axis 2")


def test_squeeze_constant_axes_checks_symbolic_dims(tmp_path: Path) -> None:
    m = make_model([helper.make_node("Squeeze", ["x", "a"], ["y"])], [vi("x", T.INT8, ["n", 3])], ["y"],
                   [const("a", [0])])
    c = compare(m, [[np.arange(3, dtype=np.int8).reshape(1, 3)]], tmp_path)
    fails(c, [np.zeros((2, 3), np.int8)], "cannot squeeze axis 0")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.bool_])
def test_transpose_perms(tmp_path: Path, dtype: type) -> None:
    perms = [[1, 0, 2, 3], [0, 2, 1, 3], [0, 2, 3, 1], [0, 1, 3, 2], [3, 2, 1, 0], [0, 3, 1, 2], [2, 0, 3, 1]]
    nodes = [helper.make_node("Transpose", ["x"], [f"y{i}"], perm=p) for i, p in enumerate(perms)]
    nodes.append(helper.make_node("Transpose", ["m"], ["ym"]))
    # 2 and 4 planes interleaved (channels-last pixels of 2 or 4 channels), and rows of h interleaved
    nodes += [helper.make_node("Transpose", ["q"], ["yq0"], perm=[0, 2, 3, 1]),
              helper.make_node("Transpose", ["q"], ["yq1"], perm=[0, 1, 3, 2]),
              helper.make_node("Transpose", ["p"], ["yp"], perm=[0, 2, 3, 1])]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = make_model(nodes, [vi("x", elem, ["a", 3, "h", 5]), vi("m", elem, ["r", "c"]), vi("q", elem, ["a", 4, "h", 2]),
                           vi("p", elem, ["a", 2, "h", 3])],
                   [f"y{i}" for i in range(len(perms))] + ["ym", "yq0", "yq1", "yp"])

    def data(*shape: int) -> np.ndarray:
        return (RNG.standard_normal(shape) * 10).astype(dtype)

    compare(m, [[data(2, 3, 4, 5), data(70, 45), data(2, 4, 4, 2), data(2, 2, 4, 3)],
                [data(1, 3, 1, 5), data(1, 33), data(1, 4, 1, 2), data(1, 2, 1, 3)],
                [data(3, 3, 3, 5), data(2, 2), data(3, 4, 3, 2), data(3, 2, 3, 3)],
                [data(0, 3, 2, 5), data(0, 3), data(0, 4, 2, 2), data(0, 2, 2, 3)]],
            tmp_path)


def test_expand_runtime_and_symbolic(tmp_path: Path) -> None:
    nodes = [helper.make_node("Expand", ["x", "s"], ["e"]), helper.make_node("Expand", ["x", "c"], ["e2"])]
    m = make_model(nodes, [vi("x", T.BFLOAT16, ["n", 1]), vi("s", T.INT64, [3])], ["e", "e2"], [const("c", [2, 4, 1])])
    x1 = randn(4, 1).astype(ml_dtypes.bfloat16)
    x2 = randn(1, 1).astype(ml_dtypes.bfloat16)
    c = compare(m, [[x1, i64(2, 1, 5)], [x1, i64(1, 4, 1)], [x2, i64(1, 4, 0)]], tmp_path)
    fails(c, [x1, i64(2, 2, 5)], "do not broadcast")
    fails(c, [x1, i64(1, -3, 1)], "negative dim")
    # the constant target [2, 4, 1] needs n in {1, 4}
    fails(c, [randn(3, 1).astype(ml_dtypes.bfloat16), i64(1, 1, 1)], r"do not broadcast: 3 vs 4 \(n = 3\)")


# cut, join, repeat ---------------------------------------------------------------------------


def test_concat_split_symbolic(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Concat", ["a", "b", "a"], ["c1"], axis=1),
        helper.make_node("Concat", ["a", "b"], ["c0"], axis=0),
        helper.make_node("Split", ["c1", "sp"], ["p0", "p1"], axis=1),
        helper.make_node("Split", ["b"], ["q0", "q1", "q2"], axis=1, num_outputs=3),
        helper.make_node("Split", ["b", "cs"], ["r0", "r1"], axis=0),
    ]
    m = make_model(nodes, [vi("a", T.INT32, ["n", "k"]), vi("b", T.INT32, ["n", 7]), vi("sp", T.INT64, [2])],
                   ["c1", "c0", "p0", "p1", "q0", "q1", "q2", "r0", "r1"], [const("cs", [1, 1])])

    def ints(*shape: int) -> np.ndarray:
        return RNG.integers(-100, 100, shape).astype(np.int32)

    c = compare(m, [[ints(2, 7), ints(2, 7), i64(3, 18)], [ints(2, 7), ints(2, 7), i64(0, 21)]], tmp_path)
    fails(c, [ints(2, 7), ints(2, 7), i64(3, 17)], "split sizes add up to 20")
    fails(c, [ints(2, 7), ints(2, 7), i64(-1, 22)], "split size 0 is negative")
    fails(c, [ints(3, 7), ints(3, 7), i64(3, 18)], "split sizes' sum")  # constant [1, 1] on a dim of 3
    fails(c, [ints(2, 5), ints(2, 7), i64(3, 14)], r"dim 1 of the inputs \(not the concat axis\) differ: 5 != 7")  # a and b along axis 0


def test_slice_runtime_bounds(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"]),
        helper.make_node("Slice", ["x", "cst", "cen", "cax", "csp"], ["y2"]),
        helper.make_node("Slice", ["x", "st", "en"], ["y3"]),
    ]
    inits = [const("cst", [-1, 1]), const("cen", [-(2**63), 2**31 - 1]), const("cax", [2, 0]), const("csp", [-2, 1])]
    m = make_model(nodes, [vi("x", T.FLOAT, ["n", 6, "w"]), vi("st", T.INT64, [2]), vi("en", T.INT64, [2]),
                           vi("ax", T.INT64, [2]), vi("sp", T.INT64, [2])], ["y", "y2", "y3"], inits)
    x1, x2 = randn(4, 6, 9), randn(1, 6, 2)
    feeds = [
        [x1, i64(1, -2), i64(5, 0), i64(-1, 1), i64(2, -1)],
        [x1, i64(2**62, -(2**63)), i64(-(2**63), 2**63 - 1), i64(2, 0), i64(-3, 2)],
        [x2, i64(0, 10), i64(-1, -20), i64(0, 1), i64(1, -(2**63))],
        [x1, i64(-100, 3), i64(100, 3), i64(1, 2), i64(1, 1)],
    ]
    c = compare(m, feeds, tmp_path)
    fails(c, [x1, i64(0, 0), i64(1, 1), i64(0, 1), i64(1, 0)], "step 1 is 0")
    fails(c, [x1, i64(0, 0), i64(1, 1), i64(1, -2), i64(1, 1)], "repeated axis")
    fails(c, [x1, i64(0, 0), i64(1, 1), i64(1, 3), i64(1, 1)], "axis 3 is out of range")


def test_tile_trilu(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Tile", ["x", "r"], ["t"]),
        helper.make_node("Tile", ["x", "cr"], ["t2"]),
        helper.make_node("Trilu", ["x", "k"], ["up"]),
        helper.make_node("Trilu", ["x", "k"], ["lo"], upper=0),
        helper.make_node("Trilu", ["x"], ["lo0"], upper=0),
    ]
    m = make_model(nodes, [vi("x", T.UINT8, ["b", "h", 5]), vi("r", T.INT64, [3]), vi("k", T.INT64, [])],
                   ["t", "t2", "up", "lo", "lo0"], [const("cr", [2, 1, 3])])
    x1 = RNG.integers(1, 255, (2, 4, 5)).astype(np.uint8)
    x2 = RNG.integers(1, 255, (1, 7, 5)).astype(np.uint8)
    feeds = [[x1, i64(1, 2, 3), np.array(1)], [x2, i64(3, 0, 1), np.array(-2)], [x1, i64(1, 1, 1), np.array(2**40)],
             [x2, i64(2, 1, 2), np.array(-(2**40))]]
    c = compare(m, feeds, tmp_path)
    fails(c, [x1, i64(1, -1, 1), np.array(0)], "repeats\\[1\\] is negative")
    fails(c, [x1, i64(1, 2**62, 2**62), np.array(0)], "too large")


# generation ----------------------------------------------------------------------------------


def test_constant_of_shape_eye_like_range(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["s"], ["f"], value=helper.make_tensor("v", T.FLOAT16, [1], [1.5])),
        helper.make_node("ConstantOfShape", ["s"], ["z"]),
        helper.make_node("ConstantOfShape", ["s"], ["i"], value=helper.make_tensor("v", T.INT64, [1], [-(2**40)])),
        helper.make_node("EyeLike", ["e"], ["eye"], k=1),
        helper.make_node("EyeLike", ["e"], ["eye2"], k=-2, dtype=T.BOOL),
        helper.make_node("Range", ["a", "l", "d"], ["ri"]),
        helper.make_node("Range", ["fa", "fl", "fd"], ["rf"]),
        helper.make_node("Range", ["ha", "hl", "hd"], ["rh"]),
    ]
    m = make_model(nodes, [vi("s", T.INT64, [2]), vi("e", T.INT32, ["r", "c"]), vi("a", T.INT32, []),
                           vi("l", T.INT32, []), vi("d", T.INT32, []), vi("fa", T.FLOAT, []), vi("fl", T.FLOAT, []),
                           vi("fd", T.FLOAT, []), vi("ha", T.FLOAT16, []), vi("hl", T.FLOAT16, []),
                           vi("hd", T.FLOAT16, [])], ["f", "z", "i", "eye", "eye2", "ri", "rf", "rh"])

    def feed(s: Sequence[int], e: tuple[int, int], ints: tuple[int, int, int], fl: tuple[float, float, float]
             ) -> list[np.ndarray]:
        return [i64(*s), np.zeros(e, np.int32), *(np.array(v, np.int32) for v in ints),
                *(np.array(v, np.float32) for v in fl), *(np.array(v, np.float16) for v in fl)]

    c = compare(m, [feed((2, 3), (3, 4), (1, 10, 3), (0.5, 3.0, 0.25)),
                    feed((0, 4), (5, 2), (10, -7, -4), (3.0, -1.0, -0.7)),
                    feed((1, 1), (0, 3), (5, 5, 1), (1.0, 0.0, 1.0))], tmp_path)
    fails(c, feed((2, -1), (3, 4), (1, 10, 3), (0.5, 3.0, 0.25)), "negative dim")
    fails(c, feed((2, 3), (3, 4), (1, 10, 0), (0.5, 3.0, 0.25)), "delta must not be 0")
    fails(c, feed((2, 3), (3, 4), (1, 10, 1), (0.0, np.inf, 1.0)), "not a valid size")


def test_range_int64_extremes(tmp_path: Path) -> None:
    m = make_model([helper.make_node("Range", ["a", "l", "d"], ["r"])],
                   [vi("a", T.INT64, []), vi("l", T.INT64, []), vi("d", T.INT64, [])], ["r"])
    c = compare(m, [[np.array(v, np.int64) for v in f] for f in
                    [(2**63 - 5, 2**63 - 1, 2), (-(2**63), -(2**63) + 3, 1), (3, -(2**63), -(2**62))]], tmp_path)
    fails(c, [np.array(v, np.int64) for v in (-(2**63), 2**63 - 1, 1)], "too long")

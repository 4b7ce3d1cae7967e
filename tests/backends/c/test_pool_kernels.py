"""Pooling, pad and depth/space C kernels against the reference interpreter.

max_pool (Indices in both storage orders, ceil_mode, dilations, SAME padding, u8/i8/f16),
average_pool (count_include_pad, ceil_mode), the global pools; pad in every mode with
constant and run-time pads and axes (negative pads crop); depth_to_space / space_to_depth in
both modes.  Symbolic dims run at two shapes; the run-time checks' messages are asserted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper

import cuvil
from tests.support.c_conv_kernels import compare, fails, make_model, randn, vi


def test_max_and_average_pool(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("MaxPool", ["x"], ["m", "mi"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["x"], ["mc", "mci"], kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1,
                         dilations=[2, 1], storage_order=1),
        helper.make_node("MaxPool", ["x"], ["ms"], kernel_shape=[3, 2], auto_pad="SAME_LOWER", strides=[2, 1]),
        helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 2, 2, 1], strides=[2, 2]),
        helper.make_node("AveragePool", ["x"], ["ai"], kernel_shape=[3, 2], pads=[1, 1, 1, 0], ceil_mode=1,
                         strides=[2, 2], count_include_pad=1),
        helper.make_node("AveragePool", ["x"], ["as"], kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2],
                         count_include_pad=1),
        helper.make_node("GlobalAveragePool", ["x"], ["ga"]),
        helper.make_node("GlobalMaxPool", ["x"], ["gm"]),
    ]
    outs = ["m", "mi", "mc", "mci", "ms", "a", "ai", "as", "ga", "gm"]
    model = make_model(nodes, [vi("x", T.FLOAT, ["n", 3, "h", "w"])], outs)
    x = randn(1, 3, 8, 9)
    x[0, 0, :2, :2] = -np.inf  # a window of -inf still reports an index inside the input
    compare(model, [[x], [randn(2, 3, 5, 12)]], tmp_path)


def test_pool_1d_3d_int_and_half(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("MaxPool", ["u"], ["mu"], kernel_shape=[2, 2], strides=[1, 2]),
        helper.make_node("MaxPool", ["i"], ["mi", "mii"], kernel_shape=[2, 2], pads=[1, 1, 0, 0]),
        helper.make_node("MaxPool", ["h"], ["mh"], kernel_shape=[3], pads=[1, 1]),
        helper.make_node("AveragePool", ["h"], ["ah"], kernel_shape=[2], strides=[2]),
        helper.make_node("AveragePool", ["v"], ["av"], kernel_shape=[2, 2, 2], pads=[0, 1, 0, 1, 0, 1]),
        helper.make_node("MaxPool", ["v"], ["mv"], kernel_shape=[2, 1, 2], dilations=[1, 1, 2]),
        helper.make_node("GlobalAveragePool", ["v"], ["gv"]),
    ]
    inputs = [vi("u", T.UINT8, [1, 2, 4, 6]), vi("i", T.INT8, [1, 1, 3, 3]), vi("h", T.FLOAT16, [2, 2, "l"]),
              vi("v", T.DOUBLE, [1, 2, 3, 4, 5])]
    model = make_model(nodes, inputs, ["mu", "mi", "mii", "mh", "ah", "av", "mv", "gv"])
    rng = np.random.default_rng(5)
    u = rng.integers(0, 256, (1, 2, 4, 6)).astype(np.uint8)
    i = rng.integers(-128, 128, (1, 1, 3, 3)).astype(np.int8)
    compare(model, [[u, i, randn(2, 2, 7, dtype=np.float16), randn(1, 2, 3, 4, 5, dtype=np.float64)],
                    [u, i, randn(2, 2, 4, dtype=np.float16), randn(1, 2, 3, 4, 5, dtype=np.float64)]],
            tmp_path, rtol=1e-3, atol=1e-3)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


def test_pad_modes_constant_and_run_time(tmp_path: Path) -> None:
    const_pads = helper.make_tensor("p", T.INT64, [4], [1, -1, 2, 2])
    axes = helper.make_tensor("ax", T.INT64, [2], [0, -1])
    nodes = [
        helper.make_node("Pad", ["x", "p"], ["c"], mode="constant"),
        helper.make_node("Pad", ["x", "p", "", "ax"], ["e"], mode="edge"),
        helper.make_node("Pad", ["x", "rp", "cv"], ["rc"], mode="constant"),
        helper.make_node("Pad", ["x", "rp"], ["rr"], mode="reflect"),
        helper.make_node("Pad", ["x", "rp"], ["rw"], mode="wrap"),
        helper.make_node("Pad", ["x", "rp2", "", "rax"], ["re"], mode="edge"),
    ]
    inputs = [vi("x", T.FLOAT, ["a", "b"]), vi("rp", T.INT64, [4]), vi("cv", T.FLOAT, []),
              vi("rp2", T.INT32, [2]), vi("rax", T.INT64, [1])]
    model = make_model(nodes, inputs, ["c", "e", "rc", "rr", "rw", "re"], [const_pads, axes])
    cv = np.array(7.5, dtype=np.float32)
    c = compare(model, [
        [randn(4, 5), _i64(2, 1, 1, 3), cv, np.array([3, -1], np.int32), _i64(1)],
        [randn(3, 6), _i64(-1, 0, 1, -2), cv, np.array([0, 2], np.int32), _i64(-2)],
    ], tmp_path)
    fails(c, [randn(4, 5), _i64(4, 0, 0, 0), cv, np.array([0, 0], np.int32), _i64(0)],
          "reflect padding of axis 0 exceeds its size 4 minus 1")
    fails(c, [randn(4, 5), _i64(-3, 0, -2, 0), cv, np.array([0, 0], np.int32), _i64(0)],
          "pads crop more than the 4 elements of axis 0")
    fails(c, [randn(4, 5), _i64(0, 0, 0, 0), cv, np.array([0, 0], np.int32), _i64(2)],
          "axis 2 is out of range for rank 2")


def test_pad_int_and_bool_types(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Pad", ["i", "p", "ci"], ["pi"], mode="constant"),
        helper.make_node("Pad", ["b", "p"], ["pb"], mode="wrap"),
        helper.make_node("Pad", ["h", "p"], ["ph"], mode="reflect"),
    ]
    inputs = [vi("i", T.INT32, [2, 3]), vi("ci", T.INT32, [1]), vi("b", T.BOOL, [2, 3]),
              vi("h", T.FLOAT16, [2, 3]), vi("p", T.INT64, [4])]
    model = make_model(nodes, inputs, ["pi", "pb", "ph"])
    i = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.array([[True, False, True], [False, False, True]])
    compare(model, [[i, np.array([-9], np.int32), b, randn(2, 3, dtype=np.float16), _i64(1, 2, 1, 2)]], tmp_path)


def test_depth_space(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("DepthToSpace", ["x"], ["d_dcr"], blocksize=2),
        helper.make_node("DepthToSpace", ["x"], ["d_crd"], blocksize=2, mode="CRD"),
        helper.make_node("SpaceToDepth", ["d_dcr"], ["s_dcr"], blocksize=2),
        helper.make_node("SpaceToDepth", ["s"], ["s3"], blocksize=3, mode="CRD"),
    ]
    inputs = [vi("x", T.FLOAT, ["n", 8, "h", "w"]), vi("s", T.INT64, [1, 2, "sh", 6])]
    model = make_model(nodes, inputs, ["d_dcr", "d_crd", "s_dcr", "s3"])
    s = np.arange(36 * 2, dtype=np.int64).reshape(1, 2, 6, 6)
    c = compare(model, [[randn(1, 8, 3, 4), s], [randn(2, 8, 2, 5), s[:, :, :3]]], tmp_path)
    fails(c, [randn(1, 8, 3, 4), s[:, :, :4]], "input height vs output height x blocksize: 4 != 3")


def test_separable_max_pool_2d_matches_reference_bitwise(tmp_path: Path) -> None:
    """The separable 2-D max pool (runtime/cuvil_pool.h) over windows that stress its edges: pads on
    one side, ceil_mode overhang, dilation, strides 1/2/3, rows wider than its 64-output blocks,
    windows with no tap inside the input, NaNs and -inf; integer types; 1 and 2 threads agree."""
    configs = [
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        dict(kernel_shape=[2, 3], strides=[1, 3], pads=[0, 2, 1, 0], ceil_mode=1),
        dict(kernel_shape=[3, 2], strides=[2, 2], dilations=[2, 3], ceil_mode=1),
        dict(kernel_shape=[1, 1], strides=[3, 2]),
        dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1]),  # corner windows hold one tap
        dict(kernel_shape=[3, 3], auto_pad="SAME_UPPER", strides=[1, 1]),
    ]
    nodes, outs = [], []
    for i, attrs in enumerate(configs):
        for name in ("x", "u", "s", "d"):
            nodes.append(helper.make_node("MaxPool", [name], [f"{name}{i}"], **attrs))  # type: ignore[arg-type]
            outs.append(f"{name}{i}")
    inputs = [vi("x", T.FLOAT, [2, 3, "h", "w"]), vi("u", T.UINT8, [1, 2, "h", "w"]),
              vi("s", T.INT8, [1, 2, "h", "w"]), vi("d", T.DOUBLE, [1, 1, "h", "w"])]
    model = make_model(nodes, inputs, outs)
    rng = np.random.default_rng(11)
    feeds = []
    for h, w in ((7, 150), (12, 9), (5, 4)):
        x = randn(2, 3, h, w)
        x[0, 0, 0, :3] = np.nan  # NaN wins its windows, as in NumPy
        x[1, 2, -1, -1] = -np.inf
        x[0, 1].flat[rng.integers(0, h * w, 4)] = np.nan
        feeds.append([x, rng.integers(0, 256, (1, 2, h, w)).astype(np.uint8),
                      rng.integers(-128, 128, (1, 2, h, w)).astype(np.int8), randn(1, 1, h, w, dtype=np.float64)])
    c = compare(model, feeds, tmp_path, target="native", rtol=0, atol=0)
    source = c.build_info.source.read_text()  # type: ignore[union-attr]
    assert "cuvil_maxpool2d_f32(" in source and "cuvil_maxpool2d_u8(" in source and "cuvil_maxpool2d_i8(" in source
    ref = cuvil.compile(model, target="ref")
    two = cuvil.compile(model, target="native", num_threads=2, cache_dir=str(tmp_path / "cache"))
    big = [randn(2, 3, 120, 130), rng.integers(0, 256, (1, 2, 120, 130)).astype(np.uint8),
           rng.integers(-128, 128, (1, 2, 120, 130)).astype(np.int8), randn(1, 1, 120, 130, dtype=np.float64)]
    for got, want, one in zip(two(*big), ref(*big), c(*big)):
        np.testing.assert_array_equal(got, want)
        assert got.tobytes() == one.tobytes()


def test_separable_max_pool_on_halves(tmp_path: Path) -> None:
    """float16 and bfloat16 max pools widen to float and narrow the max back exactly (NaN kept)."""
    import ml_dtypes

    nodes = [helper.make_node("MaxPool", [n], [f"{n}o"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
             for n in ("h", "b")]
    model = make_model(nodes, [vi("h", T.FLOAT16, [1, 4, 33, 70]), vi("b", T.BFLOAT16, [1, 4, 33, 70])], ["ho", "bo"])
    h = randn(1, 4, 33, 70).astype(np.float16)
    b = randn(1, 4, 33, 70).astype(ml_dtypes.bfloat16)
    h[0, 1, 5, 5] = np.nan
    b[0, 2, 7, 9] = np.nan
    c = compare(model, [[h, b]], tmp_path, target="native", rtol=0, atol=0)
    source = c.build_info.source.read_text()  # type: ignore[union-attr]
    assert "cuvil_maxpool2d_f16(" in source and "cuvil_maxpool2d_bf16(" in source


def test_max_pool_2x2_stride_2_float32_bit_for_bit(tmp_path: Path) -> None:
    """The 2x2 stride-2 float32 path (AVX-512 on native): rows of 4, 16 (an odd input width: the
    last column is in no window) and 35 outputs (two steps and a partial one); NaN, -inf and signed
    zeros among the inputs; one and two threads.  Bitwise the reference's result but for which NaN
    a window of two NaNs gives, and bitwise the separable path's (the generic target) even there."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("MaxPool", [f"x{i}"], [f"y{i}"], kernel_shape=[2, 2], strides=[2, 2]) for i in range(3)]
    shapes = [(2, 3, 8, 8), (1, 5, 6, 33), (1, 2, 9, 70)]
    model = make_model(nodes, [vi(f"x{i}", T.FLOAT, list(s)) for i, s in enumerate(shapes)], [f"y{i}" for i in range(3)])
    xs = []
    for s in shapes:
        x = rng.standard_normal(s).astype(np.float32)
        flat = x.reshape(-1)
        flat[rng.choice(flat.size, 12, replace=False)] = [np.nan, -np.nan, -np.inf, np.inf, -0.0, 0.0] * 2
        xs.append(x)
    ref = cuvil.compile(model, target="ref")(*xs)
    separable = cuvil.compile(model, target="generic", cache_dir=str(tmp_path))(*xs)
    for threads in (1, 2):
        got = cuvil.compile(model, target="native", cache_dir=str(tmp_path), num_threads=threads)(*xs)
        for g, r, sep in zip(got, ref, separable):
            assert g.shape == r.shape and np.array_equal(np.isnan(g), np.isnan(r))
            assert np.array_equal(g[~np.isnan(g)].view(np.uint32), r[~np.isnan(r)].view(np.uint32))
            assert np.array_equal(g.view(np.uint32), sep.view(np.uint32))

"""Small models of the classic ONNX ops (LRN, LpPool, Upsample, MaxUnpool, Compress, ...) in the forms the
conformance cases leave out, each with the outputs an oracle gives it: onnxruntime where it runs the node,
else the operator's formula in NumPy (named in the case).  tests/ops/test_classic_ops.py runs them
beside the conformance cases, in the same merged builds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support.node_batch import Case

RNG = np.random.default_rng(23)


def model(nodes: Sequence[onnx.NodeProto], feeds: Mapping[str, np.ndarray], outputs: Mapping[str, int],
          opset: int, inits: Mapping[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model of ``nodes`` whose graph inputs are ``feeds`` (their dtypes and shapes), outputs
    ``outputs`` (name -> ONNX element type) and initializers ``inits``."""
    g = helper.make_graph(
        list(nodes), "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()],
        [numpy_helper.from_array(a, n) for n, a in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def ort_outputs(m: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in sess.run(None, dict(feeds))]


def node_case(name: str, op: str, feeds: Mapping[str, np.ndarray], opset: int, out: int = TensorProto.FLOAT,
              inits: Mapping[str, np.ndarray] | None = None, order: Sequence[str] | None = None,
              formula: Callable[..., np.ndarray] | None = None, **attrs: object) -> Case:
    """One ``op`` node on ``feeds`` (then ``inits``, or the inputs ``order`` names), its output of type
    ``out``; expected: ``formula(*inputs)`` when given, else onnxruntime's outputs."""
    names = list(order) if order is not None else [*feeds, *(inits or {})]
    m = model([helper.make_node(op, names, ["y"], **attrs)], feeds, {"y": out}, opset, inits)
    if formula is not None:
        values = {**feeds, **(inits or {})}
        expected = [np.asarray(formula(*(values[n] for n in names)))]
    else:
        expected = ort_outputs(m, feeds)
    return Case(name, m, list(feeds.values()), expected)


def randn(*shape: int, dtype: type = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def lrn_formula(size: int, alpha: float, beta: float, bias: float) -> Callable[[np.ndarray], np.ndarray]:
    """LRN as the operator page writes it, in float64, one channel at a time.  (The ONNX reference
    evaluator's LRN loops over the batch instead of the channels, and onnxruntime runs 4-D inputs and
    odd sizes only.)"""

    def f(x: np.ndarray) -> np.ndarray:
        xd = x.astype(np.float64)
        channels = x.shape[1]
        square_sum = np.zeros_like(xd)
        for c in range(channels):
            lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
            square_sum[:, c] = (xd[:, lo : hi + 1] ** 2).sum(axis=1)
        return (xd / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)

    return f


def bit_shift_formula(direction: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Shifts by the type's width or more give 0 (onnxruntime's are C's, undefined there)."""

    def f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        bits = a.dtype.itemsize * 8
        out = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            s = int(b[i])
            if s < bits:
                out[i] = (int(a[i]) << s) % (1 << bits) if direction == "LEFT" else int(a[i]) >> s
        return out

    return f


def _lrn_cases() -> list[Case]:
    lrn = {"alpha": 2e-3, "beta": 0.6, "bias": 1.5}
    cases = []
    for name, shape, size, dtype in (("even_size", (2, 7, 5, 3), 4, np.float32),
                                     ("3d_spatial", (1, 6, 3, 4, 2), 3, np.float32),
                                     ("no_spatial_size1", (2, 5), 1, np.float32),
                                     ("float16", (1, 9, 4, 4), 5, np.float16)):
        cases.append(node_case(f"lrn_{name}", "LRN", {"x": randn(*shape, dtype=dtype, scale=3)}, 13,
                               helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                               formula=lrn_formula(size, **lrn), size=size, **lrn))  # type: ignore[arg-type]
    cases.append(node_case("lrn_onnxruntime", "LRN", {"x": randn(2, 8, 6, 5, scale=3)}, 13, size=5, **lrn))
    return cases


def _pool_cases() -> list[Case]:
    x = {"x": randn(2, 3, 5, 4)}
    cases = [node_case(f"global_lp_pool_p{p}", "GlobalLpPool", x, 11, p=p) for p in (1, 2, 3)]
    img = {"x": randn(1, 2, 7, 7)}
    cases.append(node_case("lp_pool_ceil_mode", "LpPool", img, 18, kernel_shape=[3, 3], strides=[2, 2],
                           ceil_mode=1, p=2))
    cases.append(node_case("lp_pool_ceil_mode_pads_dilations_p3", "LpPool", img, 18, kernel_shape=[2, 2],
                           strides=[2, 3], pads=[1, 0, 0, 1], dilations=[1, 2], ceil_mode=1, p=3))
    cases.append(node_case("lp_pool_opset11_p1", "LpPool", img, 11, kernel_shape=[3, 2], strides=[2, 2], p=1))
    # MaxPool's indices unpooled: output_shape from the input's shape, as PyTorch writes MaxUnpool
    for name, shape, pool in (("odd_output_shape", (1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2]}),
                              ("3d", (1, 2, 4, 4, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
                              ("pads", (2, 1, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})):
        feeds = {"x": randn(*shape)}
        nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **pool),
                 helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("MaxUnpool", ["p", "i", "s"], ["y"], **pool)]
        m = model(nodes, feeds, {"y": TensorProto.FLOAT}, 11)
        cases.append(Case(f"max_unpool_{name}", m, list(feeds.values()), ort_outputs(m, feeds)))
    x4 = {"x": randn(1, 1, 4, 4)}
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    m = model(nodes, x4, {"y": TensorProto.FLOAT}, 11)
    cases.append(Case("max_unpool_computed_shape", m, list(x4.values()), ort_outputs(m, x4)))
    return cases


def _resize_norm_cases() -> list[Case]:
    img = {"x": randn(1, 2, 3, 4)}
    scales = np.array([1, 1, 2, 3], np.float32)
    return [
        node_case("upsample7_nearest", "Upsample", img, 7, scales=[1.0, 1.0, 2.0, 3.0]),
        node_case("upsample7_linear", "Upsample", img, 7, scales=[1.0, 1.0, 2.0, 1.5], mode="linear"),
        node_case("upsample9_linear_constant_scales", "Upsample", img, 9, inits={"s": scales}, mode="linear"),
        node_case("upsample9_nearest_fractional", "Upsample", {**img, "s": np.array([1, 1, 1.5, 2.5], np.float32)}, 9),
        node_case("mvn_axes_1", "MeanVarianceNormalization", {"x": randn(2, 3, 4, scale=2)}, 13, axes=[1]),
        node_case("rms_normalization_float16_axis1", "RMSNormalization",
                  {"x": randn(2, 3, 4, dtype=np.float16), "s": randn(3, 4, dtype=np.float16)}, 23,
                  TensorProto.FLOAT16, axis=1),
        node_case("swish_alpha", "Swish", {"x": randn(3, 5, scale=3)}, 24, alpha=0.7),
        node_case("swiglu_formula", "SwiGLU", {"a": randn(2, 6), "b": randn(2, 6)}, 28, alpha=1.3,
                  formula=lambda a, b: (a / (1 + np.exp(-1.3 * a.astype(np.float64))) * b).astype(np.float32)),
    ]


def _index_cases() -> list[Case]:
    x = randn(5, 3, 2)
    cases = [
        node_case("reverse_sequence_3d_time_first", "ReverseSequence",
                  {"x": x, "l": np.array([5, 0, 2], np.int64)}, 10),
        node_case("reverse_sequence_3d_batch_first", "ReverseSequence",
                  {"x": x.transpose(1, 0, 2).copy(), "l": np.array([1, 5, 3], np.int64)}, 10,
                  batch_axis=0, time_axis=1),
        node_case("compress_constant_condition", "Compress", {"x": x}, 11,
                  inits={"c": np.array([True, False, True])}, axis=1),
        node_case("compress_no_axis_3d", "Compress", {"x": x, "c": RNG.random(30) > 0.5}, 11),
        node_case("compress_short_condition", "Compress", {"x": x, "c": np.array([False, True, True])}, 11,
                  axis=0),
        node_case("center_crop_pad_constant_shape", "CenterCropPad", {"x": randn(4, 3, 7)}, 18,
                  inits={"s": np.array([7, 4], np.int64)}, axes=[0, -1]),
        node_case("tensor_scatter_no_write_indices", "TensorScatter",
                  {"p": randn(2, 3, 6), "u": randn(2, 2, 6)}, 24, axis=1),
        node_case("tensor_scatter_circular_axis2", "TensorScatter",
                  {"p": randn(2, 2, 4, 3), "u": randn(2, 2, 3, 3), "w": np.array([3, 1], np.int64)}, 24,
                  axis=2, mode="circular"),
        node_case("affine_grid_unit_dims_align_corners", "AffineGrid",
                  {"t": randn(2, 2, 3), "s": np.array([2, 3, 1, 4], np.int64)}, 20, align_corners=1),
        node_case("affine_grid_3d_constant_size", "AffineGrid", {"t": randn(1, 3, 4)}, 20,
                  inits={"s": np.array([1, 2, 1, 3, 2], np.int64)}, align_corners=1),
    ]
    return cases


def _int_math_cases() -> list[Case]:
    shifts = np.array([0, 1, 7, 8, 9, 31, 32, 63, 64, 70], np.uint8)
    cases = []
    for dtype in (np.uint8, np.uint64):
        values = np.array([1, 3, 200, 255, 7, 1, 2, 9, 5, 6], dtype)
        for direction in ("LEFT", "RIGHT"):
            cases.append(node_case(f"bit_shift_wide_{np.dtype(dtype).name}_{direction.lower()}", "BitShift",
                                   {"a": values, "b": shifts.astype(dtype)}, 11,
                                   helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                   formula=bit_shift_formula(direction), direction=direction))
    for dtype in (np.int8, np.uint16, np.int64):
        cases.append(node_case(f"bitwise_not_{np.dtype(dtype).name}", "BitwiseNot",
                               {"x": np.array([0, 1, -1 if dtype != np.uint16 else 65535, 5], dtype)}, 18,
                               helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), formula=np.invert))
    cases.append(node_case("cumprod_int64_reverse_exclusive", "CumProd",
                           {"x": RNG.integers(-4, 5, (3, 4)).astype(np.int64), "a": np.array(0, np.int64)}, 26,
                           TensorProto.INT64, reverse=1, exclusive=1))
    cases.append(node_case("cumprod_float_axis_last", "CumProd",
                           {"x": randn(2, 3, 4), "a": np.array(-1, np.int32)}, 26))
    mats = randn(3, 4, 4, scale=2)
    mats[1, 2] = mats[1, 0] * 2  # a singular matrix
    cases.append(node_case("det_4x4_batch", "Det", {"x": mats}, 22))
    cases.append(node_case("det_float64_5x5", "Det", {"x": randn(2, 5, 5, dtype=np.float64)}, 22, TensorProto.DOUBLE,
                           formula=np.linalg.det))
    cases.append(node_case("hann_window_constant_size_symmetric_double", "HannWindow", {}, 17, TensorProto.DOUBLE,
                           inits={"n": np.array(7, np.int64)}, periodic=0, output_datatype=TensorProto.DOUBLE))
    cases.append(node_case("blackman_window_int32_size", "BlackmanWindow", {"n": np.array(9, np.int32)}, 17))
    return cases


def classic_cases() -> list[Case]:
    """Every case of this module (onnxruntime computes the expected outputs of most)."""
    return _lrn_cases() + _pool_cases() + _resize_norm_cases() + _index_cases() + _int_math_cases()

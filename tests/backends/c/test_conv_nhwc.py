"""The channels-last convolution kernels (conv_nhwc, cuvil_conv_nhwc.h, cuvil_nhwc_direct.h) against the
reference interpreter.

Each case runs ``convert-layout{convs=all}`` so every convolution goes through conv_nhwc.  The direct
kernel: 1x1 over the flattened pixels (strips of full, 4 and 1 pixels; panels of 1 to 4 vectors, a
partial last vector, several panels, several L2 chunks of panels, groups), strided 1x1, k x k with
padding / strides / dilations (tap rows as one run or one run per tap, border pixels one by one), a
3-channel stride-2 stem, groups.  A convolution whose weight panels outgrow the cache (K > 8192) runs
im2col + GEMM.  Depthwise: multiplier 1 (the 3x3 strips at strides 1 and 2, the generic strips,
channel counts with and without a vector remainder) and 2.  SAME padding, a symbolic batch, and the
fused epilogue (bias, clip, a residual).  Tolerance: 1e-5 relative and absolute, as for the NCHW
kernels (1e-4 for the 8280-term sums of the GEMM case).  Results are bitwise the same with 1 and 2
threads; generic and wasm32 build and agree.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import cuvil
from tests.support.c_conv_kernels import make_model, vi

RNG = np.random.default_rng(11)
PIPELINE = ("canonicalize,fold-constants,cse,dce,fold-batchnorm,convert-layout{convs=all},"
            "recognize-gelu,fuse-epilogue,fuse-elementwise")


def _w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) / 4).astype(np.float32), name)


def _branch(tag: str, cin: int, cout: int, k: tuple[int, int], hw: tuple[int, int], *, relu6: bool = True,
            residual: bool = False, bias: bool = True, **attrs: object,
            ) -> tuple[list[onnx.NodeProto], onnx.ValueInfoProto, str, list[onnx.TensorProto]]:
    """Conv (+ clip to [0, 6]) (+ the input as a residual) from input ``X_tag`` to ``Y_tag``."""
    group = int(attrs.get("group", 1))  # type: ignore[call-overload]
    x, w, b = f"X_{tag}", f"W_{tag}", f"B_{tag}"
    inits = [_w(w, (cout, cin // group, *k))] + ([_w(b, (cout,))] if bias else [])
    nodes = [helper.make_node("Conv", [x, w, b] if bias else [x, w], [f"C_{tag}"], **attrs)]
    out = f"C_{tag}"
    if relu6:
        inits += [numpy_helper.from_array(np.float32(0), f"lo_{tag}"), numpy_helper.from_array(np.float32(6), f"hi_{tag}")]
        nodes.append(helper.make_node("Clip", [out, f"lo_{tag}", f"hi_{tag}"], [f"R_{tag}"]))
        out = f"R_{tag}"
    if residual:
        nodes.append(helper.make_node("Add", [out, x], [f"S_{tag}"]))
        out = f"S_{tag}"
    nodes.append(helper.make_node("Identity", [out], [f"Y_{tag}"]))
    return nodes, vi(x, T.FLOAT, ["n", cin, *hw]), f"Y_{tag}", inits


def _model(branches: dict[str, dict[str, object]]) -> onnx.ModelProto:
    """One model holding every branch (one compile for all of them)."""
    nodes, ins, outs, inits = [], [], [], []
    for tag, kw in branches.items():
        n, i, o, w = _branch(tag, **kw)  # type: ignore[arg-type]
        nodes += n
        ins.append(i)
        outs.append(o)
        inits += w
    return make_model(nodes, ins, outs, inits)


def _inputs(model: onnx.ModelProto, n: int) -> list[np.ndarray]:
    dims = [[d.dim_value for d in i.type.tensor_type.shape.dim][1:] for i in model.graph.input]
    return [RNG.standard_normal((n, *d)).astype(np.float32) for d in dims]


def _compile(model: onnx.ModelProto, target: str, cache: Path, threads: int | None = None) -> cuvil.CompiledModel:
    return cuvil.compile(model, target=target, passes=PIPELINE, cache_dir=str(cache), num_threads=threads)


CASES: dict[str, dict[str, object]] = {
    "1x1": dict(cin=8, cout=40, k=(1, 1), hw=(6, 5)),
    "1x1_strided": dict(cin=8, cout=12, k=(1, 1), hw=(7, 6), strides=[2, 2]),
    "3x3_pad": dict(cin=5, cout=9, k=(3, 3), hw=(7, 8), pads=[1, 1, 1, 1]),
    "5x3_stride_dil": dict(cin=6, cout=7, k=(5, 3), hw=(13, 11), pads=[2, 0, 1, 2], strides=[2, 1], dilations=[1, 2]),
    "grouped": dict(cin=8, cout=6, k=(3, 3), hw=(6, 6), group=2, pads=[1, 1, 1, 1]),
    "same_upper": dict(cin=4, cout=8, k=(3, 3), hw=(7, 6), auto_pad="SAME_UPPER", strides=[2, 2]),
    "depthwise": dict(cin=35, cout=35, k=(3, 3), hw=(9, 12), group=35, pads=[1, 1, 1, 1]),
    "depthwise_s2": dict(cin=32, cout=32, k=(3, 3), hw=(11, 14), group=32, pads=[1, 1, 1, 1], strides=[2, 2]),
    "depthwise_5x5_dil": dict(cin=16, cout=16, k=(5, 5), hw=(13, 13), group=16, pads=[4, 4, 4, 4], dilations=[2, 2]),
    "depthwise_mult2": dict(cin=6, cout=12, k=(3, 3), hw=(7, 7), group=6, pads=[1, 0, 1, 0]),
    "residual_no_bias": dict(cin=16, cout=16, k=(3, 3), hw=(6, 7), group=16, pads=[1, 1, 1, 1], relu6=False,
                             residual=True, bias=False),
    "1x1_residual": dict(cin=16, cout=16, k=(1, 1), hw=(6, 7), residual=True),
    "1x1_to_16": dict(cin=32, cout=16, k=(1, 1), hw=(5, 7)),
    "1x1_to_24_residual": dict(cin=24, cout=24, k=(1, 1), hw=(5, 6), residual=True),
    "1x1_wide": dict(cin=20, cout=200, k=(1, 1), hw=(3, 5)),
    "1x1_chunks": dict(cin=256, cout=512, k=(1, 1), hw=(3, 3)),
    "1x1_groups": dict(cin=16, cout=96, k=(1, 1), hw=(4, 5), group=2),
    "stem": dict(cin=3, cout=32, k=(3, 3), hw=(15, 17), pads=[1, 1, 1, 1], strides=[2, 2]),
    "depthwise_wide": dict(cin=48, cout=48, k=(3, 3), hw=(5, 21), group=48, pads=[1, 1, 1, 1]),
    "depthwise_s2_wide": dict(cin=40, cout=40, k=(3, 3), hw=(6, 37), group=40, pads=[1, 1, 1, 1], strides=[2, 2]),
    "1x1_odd_no_bias": dict(cin=7, cout=33, k=(1, 1), hw=(5, 9), bias=False),
}


def test_matches_reference(tmp_path: Path) -> None:
    model = _model(CASES)
    c = _compile(model, "native", tmp_path)
    assert c.build_info is not None and c.build_info.warnings == ""
    fused = [n for n in c.graph.nodes if n.op == "fused_conv_nhwc"]
    assert len(fused) == len(CASES), [n.op for n in c.graph.nodes]
    assert not any(n.op in ("conv", "fused_conv") for n in c.graph.nodes)
    ref = cuvil.compile(model, target="ref")
    for n in (1, 3):
        xs = _inputs(model, n)
        for tag, got, want in zip(CASES, c(*xs), ref(*xs)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=tag)


def test_gemm_path_for_large_k(tmp_path: Path) -> None:
    """K = 3 * 3 * 920 = 8280: the weight panels outgrow the cache and im2col + GEMM runs instead."""
    case = {"big_k": dict(cin=920, cout=8, k=(3, 3), hw=(3, 4), pads=[1, 1, 1, 1])}
    model = _model(case)
    c = _compile(model, "native", tmp_path)
    ref = cuvil.compile(model, target="ref")
    xs = _inputs(model, 2)
    np.testing.assert_allclose(c(*xs)[0], ref(*xs)[0], rtol=1e-4, atol=1e-4)


def test_bitwise_same_across_thread_counts(tmp_path: Path) -> None:
    model = _model({
        "dw": dict(cin=64, cout=64, k=(3, 3), hw=(28, 28), group=64, pads=[1, 1, 1, 1]),
        "dw_s2": dict(cin=48, cout=48, k=(3, 3), hw=(28, 28), group=48, pads=[1, 1, 1, 1], strides=[2, 2]),
        "k3": dict(cin=32, cout=48, k=(3, 3), hw=(28, 28), pads=[1, 1, 1, 1]),
        "k1": dict(cin=64, cout=96, k=(1, 1), hw=(28, 28)),
        "k1_columns": dict(cin=64, cout=1280, k=(1, 1), hw=(7, 7)),
    })
    one, two = _compile(model, "native", tmp_path, 1), _compile(model, "native", tmp_path, 2)
    xs = _inputs(model, 4)
    for a, b in zip(one(*xs), two(*xs)):
        np.testing.assert_array_equal(a, b)


def test_generic_target_and_notes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _model({k: CASES[k] for k in ("depthwise", "depthwise_mult2", "5x3_stride_dil", "1x1", "1x1_to_24_residual",
                                          "stem", "depthwise_s2_wide")})
    with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
        c = cuvil.compile(model, target="generic", passes=PIPELINE, cache_dir=str(tmp_path))
    assert c.build_info is not None and c.build_info.warnings == ""
    assert "NHWC depthwise" in caplog.text and "NHWC convolution, direct" in caplog.text
    ref = cuvil.compile(model, target="ref")
    xs = _inputs(model, 2)
    for got, want in zip(c(*xs), ref(*xs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_wasm32(wasm_cache: str) -> None:
    model = _model({k: CASES[k] for k in ("depthwise", "3x3_pad", "1x1_residual", "1x1_to_24_residual", "stem")})
    m = cuvil.compile(model, target="wasm32", passes=PIPELINE, cache_dir=wasm_cache)
    ref = cuvil.compile(model, target="ref")
    xs = _inputs(model, 2)
    for got, want in zip(m(*xs), ref(*xs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_runs_channels_last(precision: str, tmp_path: Path) -> None:
    """precision=fp16/bf16: the convolutions still go channels-last (the float32 kernels on widened
    operands, weights widened once per model) and match the reference's reduced-precision graph within
    one rounding of the result; a second call (cached weights) gives the same bits, and so does a build
    on two threads.  bf16 pointwise convolutions run on vdpbf16ps where the CPU has it (cuvil_conv_nhwc_half.h):
    the 1x1 cases, an odd channel count among them."""
    cases = {k: CASES[k] for k in ("1x1_to_24_residual", "stem", "depthwise_s2_wide", "grouped", "1x1_wide",
                                   "1x1_odd_no_bias", "1x1_chunks")}
    model = _model(cases)
    c = cuvil.compile(model, target="native", passes=PIPELINE, cache_dir=str(tmp_path), precision=precision)
    low = np.float16 if precision == "fp16" else cuvil.ir.dtypes.DType.bf16.np
    convs = [n for n in c.graph.nodes if n.op == "fused_conv_nhwc"]
    assert len(convs) == len(cases) and all(n.outputs[0].type.dtype.np == low for n in convs)
    ref = cuvil.compile(model, target="ref", precision=precision)
    step = 2.0 ** (-10 if precision == "fp16" else -7)
    xs = _inputs(model, 2)
    first = c(*xs)
    for tag, got, want in zip(cases, first, ref(*xs)):
        err = np.abs(got.astype(np.float64) - want.astype(np.float64))
        assert np.all(err <= step * np.abs(want.astype(np.float64)) + 1e-3), (tag, float(np.max(err)))
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, c(*xs)))
    two = cuvil.compile(model, target="native", passes=PIPELINE, cache_dir=str(tmp_path), precision=precision,
                        num_threads=2)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, two(*xs)))


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_depthwise_is_the_float32_kernel_rounded_once(precision: str, tmp_path: Path) -> None:
    """A f16/bf16 depthwise convolution widens bands of input rows per thread (cuvil_conv_nhwc_half.h):
    its result is bitwise the float32 build's on the same rounded input, weights and bias, rounded
    once, at one and two threads (bands that end at an image's last row, padding wider than a band,
    a channel multiplier, a batch of three whose rows split over tasks across images)."""
    tags = ("depthwise", "depthwise_s2", "depthwise_5x5_dil", "depthwise_mult2", "depthwise_wide", "depthwise_s2_wide")
    cases = {k: CASES[k] for k in tags}
    cases["depthwise_large"] = dict(cin=64, cout=64, k=(3, 3), hw=(30, 33), group=64, pads=[1, 1, 1, 1])
    model = _model(cases)
    low = np.float16 if precision == "fp16" else cuvil.ir.dtypes.DType.bf16.np
    rounded = onnx.ModelProto()
    rounded.CopyFrom(model)
    for init in rounded.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(low).astype(np.float32), init.name))
    xs = [x.astype(low).astype(np.float32) for x in _inputs(model, 3)]
    want = [y.astype(low).astype(np.float32) for y in _compile(rounded, "native", tmp_path, threads=1)(*xs)]
    for threads in (1, 2):
        c = cuvil.compile(model, target="native", passes=PIPELINE, cache_dir=str(tmp_path), precision=precision,
                          num_threads=threads)
        convs = [n for n in c.graph.nodes if n.op == "fused_conv_nhwc"]
        assert len(convs) == len(cases) and all(n.outputs[0].type.dtype.np == low for n in convs)
        if threads > 1:
            c.set_split_policy("always")  # every region threads, whatever the machine's load
        before = c.thread_stats()
        got = c(*xs)
        if threads > 1:
            step = c.thread_stats().since(before)
            assert step.regions >= 1 and step.declined_regions == 0, step
        for tag, g_, w_ in zip(cases, got, want):
            assert g_.tobytes() == w_.tobytes(), (tag, threads)  # the model's outputs are float32


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_epilogues_round_as_the_unfused_ops(precision: str, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """f16/bf16 channels-last convolutions with a fused epilogue (clip, a residual add) give bitwise
    what the unfused ops give (each op's result rounded to its type): depthwise (3x3 read in place;
    multiplier 2 and 5x5 dilated by bands of rows), a dense stem, pointwise ones (vdpbf16ps for bf16 where the CPU has it) with an odd channel count
    and a residual, at one and two threads.  A clip alone runs inside the kernel, before the
    rounding (cuvil_conv_nhwc_half.h); a residual add after it."""
    cases = {k: CASES[k] for k in ("depthwise", "depthwise_mult2", "depthwise_5x5_dil", "residual_no_bias", "stem",
                                   "1x1_to_24_residual", "1x1_wide", "1x1_residual")}
    cases["1x1_odd_residual"] = dict(cin=33, cout=33, k=(1, 1), hw=(5, 7), residual=True)
    model = _model(cases)
    xs = _inputs(model, 2)
    unfused = PIPELINE.replace(",fuse-epilogue,fuse-elementwise", "")
    plain = cuvil.compile(model, target="native", passes=unfused, cache_dir=str(tmp_path), precision=precision)
    assert not any(n.op.startswith("fused_") for n in plain.graph.nodes)
    want = plain(*xs)
    for threads in (1, 2):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
            c = cuvil.compile(model, target="native", passes=PIPELINE, cache_dir=str(tmp_path), precision=precision,
                              num_threads=threads)
        assert sum(n.op == "fused_conv_nhwc" for n in c.graph.nodes) == len(cases)
        clamped = [r.getMessage() for r in caplog.records if "clamp (relu or clip) applied before" in r.getMessage()]
        after = [r.getMessage() for r in caplog.records if "one pass over its result" in r.getMessage()]
        # the clip-only cases (depthwise, depthwise_mult2, depthwise_5x5_dil, stem, 1x1_wide); the residual
        # ones add after the kernel
        assert len(clamped) == 5 and len(after) == 4, (clamped, after)
        for tag, got, w_ in zip(cases, c(*xs), want):
            assert got.tobytes() == w_.tobytes(), (tag, threads)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_targets_agree(precision: str, tmp_path: Path, wasm_cache: str) -> None:
    """f16/bf16 channels-last convolutions (depthwise read in place and by bands, dense, pointwise,
    clamps and residuals fused) give the same bits on native, generic and wasm32 builds."""
    cases = {k: CASES[k] for k in ("depthwise", "depthwise_mult2", "depthwise_s2_wide", "stem", "1x1_to_24_residual",
                                   "1x1_wide")}
    model = _model(cases)
    xs = _inputs(model, 2)
    want = cuvil.compile(model, target="native", passes=PIPELINE, cache_dir=str(tmp_path), precision=precision)(*xs)
    for target, cache in (("generic", str(tmp_path)), ("wasm32", wasm_cache)):
        got = cuvil.compile(model, target=target, passes=PIPELINE, cache_dir=cache, precision=precision)(*xs)
        for tag, g_, w_ in zip(cases, got, want):
            assert g_.tobytes() == w_.tobytes(), (target, tag)

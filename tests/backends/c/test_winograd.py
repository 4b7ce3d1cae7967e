"""Winograd convolutions (cuvil_winograd.h) and the per-node algorithm choice (conv_algorithm.py).

Every variant runs against the reference interpreter on one model holding several 3x3 convolutions
(odd sizes, padding 0/1/2 and asymmetric, SAME, batch > 1, channel counts that are not multiples
of the vector width) with fused bias / ReLU / residual-add epilogues.  Tolerances (relative L2
per output, float32 weights and inputs of unit scale): F(2x2,3x3) 1e-6, F(4x4,3x3) 5e-6,
F(6x6,3x3) 2e-5 -- the float32 rounding of the transforms grows with the tile (measured here:
about 3e-7, 1.5e-6, 3e-6).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import cuvil
from cuvil.backends.c.kernels.conv_algorithm import ConvAlgorithmError, ConvShape, choose, estimate
from cuvil.metrics import relative_l2
from tests.support.c_conv_kernels import make_model, vi

RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One private C build cache for the module: tests compiling the same model share its build."""
    return str(tmp_path_factory.mktemp("cuvil-cache"))
TOLERANCE = {"winograd-f2": 1e-6, "winograd-f4": 5e-6, "winograd-f6": 2e-5, "im2col": 1e-6}


def _w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name)


def _mixed_model(batch: int = 2) -> onnx.ModelProto:
    """Five 3x3 convolutions of different geometry, with epilogues, and one strided conv between."""
    nodes = [
        # odd sizes, pads 1, bias + ReLU (fused epilogue)
        helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        # no padding, no bias
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[0, 0, 0, 0], name="conv2"),
        # asymmetric pads 2/0 and 1/2, bias, residual add of a same-shaped value, then ReLU
        helper.make_node("Conv", ["c2", "W3", "B3"], ["c3"], pads=[2, 1, 0, 2], name="conv3"),
        helper.make_node("Conv", ["c2", "W4", "B4"], ["c4"], pads=[2, 1, 0, 2], name="conv4"),
        helper.make_node("Add", ["c3", "c4"], ["a34"]),
        helper.make_node("Relu", ["a34"], ["r34"]),
        # SAME_UPPER padding
        helper.make_node("Conv", ["r34", "W5", "B5"], ["c5"], auto_pad="SAME_UPPER", name="conv5"),
        # a strided 3x3 conv: never Winograd
        helper.make_node("Conv", ["c5", "W6"], ["Y"], strides=[2, 2], pads=[1, 1, 1, 1], name="strided"),
    ]
    inits = [_w("W1", (19, 5, 3, 3)), _w("B1", (19,)), _w("W2", (24, 19, 3, 3)), _w("W3", (17, 24, 3, 3)),
             _w("B3", (17,)), _w("W4", (17, 24, 3, 3)), _w("B4", (17,)), _w("W5", (33, 17, 3, 3)), _w("B5", (33,)),
             _w("W6", (8, 33, 3, 3))]
    return make_model(nodes, [vi("X", T.FLOAT, [batch, 5, 13, 11])], ["Y", "c5", "r1"], inits)


def _reference(model: onnx.ModelProto, xs: list[np.ndarray]) -> list[np.ndarray]:
    return [o.astype(np.float64) for o in cuvil.compile(model, target="ref")(*xs)]


@pytest.mark.parametrize("alg", ["winograd-f2", "winograd-f4", "winograd-f6", "im2col"])
def test_each_algorithm_matches_reference(alg: str, cache: str, caplog: pytest.LogCaptureFixture) -> None:
    model = _mixed_model()
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
        m = cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=alg)
    assert m.build_info is not None and "model.c" not in m.build_info.warnings
    for got, want in zip(m(x), _reference(model, [x])):
        assert got.shape == want.shape
        assert relative_l2(got, want) < TOLERANCE[alg], (alg, relative_l2(got, want))
    notes = [r.getMessage() for r in caplog.records]
    if alg == "im2col":
        assert not any("conv by Winograd" in n for n in notes)
        return
    tile = alg[-1]
    wino = [n for n in notes if f"3x3 conv by Winograd F({tile}x{tile},3x3)" in n]
    assert {n.split("'")[1] for n in wino} == {"conv1", "conv2", "conv3", "conv4", "conv5"}
    # fused epilogues run inside the output transform: no separate pass over the result
    assert any("conv1" in n and "epilogue in its output transform" in n for n in wino)
    assert not any("one pass over its result" in n and "'conv1'" in n for n in notes)
    assert any("'strided'" in n and "im2col" in n and "unit strides only" in n for n in notes)


@pytest.mark.parametrize("alg", ["winograd-f2", "winograd-f4", "winograd-f6", "im2col"])
def test_results_do_not_depend_on_thread_count(alg: str, cache: str) -> None:
    model = _mixed_model()  # as in test_each_algorithm_matches_reference (tile rows of two images per block)
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    outs = []
    for threads in (1, 2, 3):
        m = cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=alg,
                          num_threads=threads)
        outs.append(m(x))
    for one, *more in zip(*outs):
        for other in more:
            np.testing.assert_array_equal(one, other)


def test_wide_rows_and_many_channels(cache: str) -> None:
    """Rows and channel counts spanning several whole vectors, so the kernel's transposes (input
    rows to channels-innermost, output tiles to rows) run, next to their partial edges."""
    nodes = [helper.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="wide1"),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "W2", "B2"], ["c2"], pads=[0, 2, 1, 0], name="wide2"),
             helper.make_node("Add", ["c2", "Z"], ["a2"]),
             helper.make_node("Conv", ["a2", "W3"], ["Y"], pads=[1, 1, 1, 1], name="wide3")]
    model = make_model(nodes, [vi("X", T.FLOAT, [2, 20, 7, 37]), vi("Z", T.FLOAT, [2, 33, 6, 37])], ["Y", "r1"],
                       [_w("W1", (40, 20, 3, 3)), _w("B1", (40,)), _w("W2", (33, 40, 3, 3)), _w("B2", (33,)),
                        _w("W3", (17, 33, 3, 3))])
    x = RNG.standard_normal((2, 20, 7, 37)).astype(np.float32)
    z = RNG.standard_normal((2, 33, 6, 37)).astype(np.float32)
    m = cuvil.compile(model, target="native", cache_dir=cache,
                      conv_algorithm={"wide1": "winograd-f4", "wide2": "winograd-f2", "wide3": "winograd-f6"})
    for got, want in zip(m(x, z), _reference(model, [x, z])):
        assert relative_l2(got, want) < TOLERANCE["winograd-f6"]


def test_generic_target_and_run_time_weights(cache: str) -> None:
    """Portable C (no vector width assumed), a symbolic batch, and weights that are an input
    (transformed per call instead of once per model)."""
    nodes = [helper.make_node("Conv", ["X", "Wt", "B"], ["c"], pads=[1, 0, 1, 2]),
             helper.make_node("Relu", ["c"], ["Y"])]
    model = make_model(nodes, [vi("X", T.FLOAT, ["n", 7, 9, 10]), vi("Wt", T.FLOAT, [6, 7, 3, 3])], ["Y"],
                       [_w("B", (6,))])
    m = cuvil.compile(model, target="generic", cache_dir=cache, conv_algorithm="winograd-f4")
    for n in (1, 4):
        x = RNG.standard_normal((n, 7, 9, 10)).astype(np.float32)
        w = (RNG.standard_normal((6, 7, 3, 3)) / 8).astype(np.float32)
        got, want = m(x, w)[0], _reference(model, [x, w])[0]
        assert relative_l2(got, want) < TOLERANCE["winograd-f4"]


def test_wasm32(wasm_cache: str) -> None:
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["Y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [vi("X", T.FLOAT, [2, 3, 9, 7])], ["Y"], [_w("W", (5, 3, 3, 3)), _w("B", (5,))])
    x = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    m = cuvil.compile(model, target="wasm32", cache_dir=wasm_cache, conv_algorithm="winograd-f2")
    assert relative_l2(m(x)[0], _reference(model, [x])[0]) < TOLERANCE["winograd-f2"]


def test_per_node_choice_and_validation(cache: str, caplog: pytest.LogCaptureFixture) -> None:
    model = _mixed_model()
    with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
        m = cuvil.compile(model, target="native", cache_dir=cache,
                          conv_algorithm={"conv2": "winograd-f6", "conv5": "im2col", "strided": "im2col"})
    notes = [r.getMessage() for r in caplog.records]
    assert any("'conv2'" in n and "F(6x6,3x3)" in n for n in notes)
    assert any("'conv5'" in n and "conv_algorithm='im2col'" in n for n in notes)
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    assert relative_l2(m(x)[0], _reference(model, [x])[0]) < TOLERANCE["winograd-f6"]
    with pytest.raises(ConvAlgorithmError, match="unknown convolution algorithm 'winograd-f3'"):
        cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm="winograd-f3")
    with pytest.raises(ConvAlgorithmError, match="'nope', which is not a convolution node"):
        cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm={"nope": "winograd-f2"})
    with pytest.raises(ConvAlgorithmError, match=r"conv_algorithm\['strided'\]='winograd-f4' does not apply: "
                                                 r"strides \[2, 2\]"):
        cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm={"strided": "winograd-f4"})
    with pytest.raises(ConvAlgorithmError, match="mapping from node name"):
        cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=4)  # type: ignore[arg-type]
    with pytest.raises(cuvil.CuvilError, match="conv_algorithm applies to the C and wasm32 targets"):
        cuvil.compile(model, target="ref", conv_algorithm="winograd-f2")


def test_cost_model_choices() -> None:
    """The picks on layers whose timings the cost model was fitted to (docs/conv-algorithms.md):
    F(4x4,3x3) for ResNet-18's 3x3 layers at batch 1 and 16, F(2x2,3x3) where 4x4 tiles overhang
    a 7x7 image, and the GEMM where few channels would be padded to whole vectors (3 -> 64 at
    224x224, 8 channels at 112x112, 16 at 56x56), where Winograd measured slower."""
    def pick(n: int, cin: int, cout: int, hw: int) -> str:
        ch = choose("x", ConvShape(None, n, cin, cout, hw, hw), "auto")
        return "im2col" if not hasattr(ch, "m") else f"F{ch.m}"

    for n in (1, 16):
        assert pick(n, 64, 64, 56) == "F4"
        assert pick(n, 128, 128, 28) == "F4"
        assert pick(n, 256, 256, 14) == "F4"
    assert pick(1, 512, 512, 7) == "F2"
    assert pick(1, 64, 64, 7) == "F2"
    assert pick(1, 3, 64, 224) == "im2col"
    assert pick(1, 8, 8, 112) == "im2col"
    assert pick(1, 16, 16, 56) == "im2col"
    assert set(estimate(ConvShape(None, 1, 64, 64, 56, 56))) == {"im2col", "F2", "F4"}
    # "winograd" takes the cheaper tile even where the GEMM would win
    assert getattr(choose("x", ConvShape(None, 1, 3, 64, 224, 224), "winograd"), "m", None) == 4
    # a global choice applies where it can and leaves the other nodes to the cost model
    assert not hasattr(choose("s", ConvShape("strides [2, 2] (Winograd: unit strides only)"), "winograd-f4"), "m")


@pytest.mark.parametrize("fault", ["conv-stride", "conv-pad"])
def test_planted_faults_change_the_generated_code(fault: str, cache: str) -> None:
    model = _mixed_model()
    clean = cuvil.compile(model, target="native", cache_dir=cache)
    with cuvil.faults.plant(fault):
        bad = cuvil.compile(model, target="native", cache_dir=cache)
    src = [m.build_info.source.read_text() for m in (clean, bad) if m.build_info is not None]
    assert src[0] != src[1]
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    assert relative_l2(bad(x)[0], clean(x)[0]) > 1e-2  # the strided conv (and, for the pad, all) is wrong


@pytest.mark.parametrize("alg", ["winograd-f2", "winograd-f4"])
def test_deep_layer_input_transform_per_thread_or_shared(alg: str, cache: str) -> None:
    """A deep-layer shape (one block of tile rows, three panels of output channels): with two threads
    each thread makes the block's input transform for its own panels; with four, F(4x4,3x3)'s
    repeated transforms would cost more than CUVIL_WINO_REPEAT_MAX of the products, so it is made
    once, split by tile slots, and shared by the panel tasks (F(2x2,3x3)'s cheaper one stays per
    thread).  Same bits as one thread, and the reference's result, epilogue (bias, residual, ReLU)
    included."""
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="deep"),
             helper.make_node("Add", ["c", "Z"], ["a"]),
             helper.make_node("Relu", ["a"], ["Y"])]
    model = make_model(nodes, [vi("X", T.FLOAT, [1, 128, 10, 10]), vi("Z", T.FLOAT, [1, 96, 10, 10])], ["Y"],
                       [_w("W", (96, 128, 3, 3)), _w("B", (96,))])
    x = RNG.standard_normal((1, 128, 10, 10)).astype(np.float32)
    z = RNG.standard_normal((1, 96, 10, 10)).astype(np.float32)
    outs = [cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=alg, num_threads=t)(x, z)[0]
            for t in (1, 2, 4)]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()
    assert relative_l2(outs[1], _reference(model, [x, z])[0]) < TOLERANCE[alg]


@pytest.mark.parametrize("alg", ["winograd-f2", "winograd-f4", "winograd-f6"])
def test_small_image_with_one_panel_is_split_into_smaller_blocks(alg: str, cache: str) -> None:
    """A CIFAR-sized layer (one image, 32 output channels: one block of one panel): with several
    threads it is cut into smaller blocks of tile rows.  Same bits as one thread, and the reference's
    result."""
    nodes = [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="small"),
             helper.make_node("Relu", ["c"], ["Y"])]
    model = make_model(nodes, [vi("X", T.FLOAT, [1, 32, 32, 32])], ["Y"], [_w("W", (32, 32, 3, 3)), _w("B", (32,))])
    x = RNG.standard_normal((1, 32, 32, 32)).astype(np.float32)
    outs = [cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=alg, num_threads=t)(x)[0]
            for t in (1, 2, 3)]
    assert outs[0].tobytes() == outs[1].tobytes() == outs[2].tobytes()
    assert relative_l2(outs[1], _reference(model, [x])[0]) < TOLERANCE[alg]


def test_only_the_tile_sizes_a_model_runs_are_compiled(cache: str) -> None:
    """The generated file sets CUVIL_WINO_TILES to the sizes its convolutions use, and the library
    holds those sizes' tasks alone; a model with no Winograd convolution sets none."""
    import re
    import shutil
    import subprocess

    model = _mixed_model()
    choice = {"conv1": "winograd-f2", "conv2": "winograd-f6", "conv3": "im2col", "conv4": "im2col", "conv5": "im2col"}
    m = cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm=choice)
    info = m.build_info
    assert info is not None
    assert re.findall(r"#define CUVIL_WINO_TILES (\S+)", info.source.read_text()) == [hex((1 << 2) | (1 << 6))]
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    assert relative_l2(m(x)[0], _reference(model, [x])[0]) < TOLERANCE["winograd-f6"]
    none = cuvil.compile(model, target="native", cache_dir=cache, conv_algorithm="im2col").build_info
    assert none is not None and "CUVIL_WINO_TILES" not in none.source.read_text()
    if shutil.which("nm") is None:
        pytest.skip("nm is not installed: which Winograd tasks the library holds is not checked")
    symbols = subprocess.run(["nm", str(info.library)], capture_output=True, text=True, check=True).stdout
    tasks = set(re.findall(r"\bcuvil_wino_task(\d)\b", symbols))
    assert tasks == {"2", "6"}

"""The vision and signal ops of the ONNX default domain (GridSample, RoiAlign, ...): their ONNX
conformance cases on ref, native and wasm32, and random inputs against ONNX's reference
implementation (onnxruntime where that reference does not model an older opset).

The conformance cases of all the ops run many to a build (tests/support/conformance_batch.py)
and are compared by the conformance runner's rules (rtol 1e-3, atol 1e-7)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx.reference import ReferenceEvaluator

import cuvil
from cuvil.conformance import CORE_OPS, case_dirs
from cuvil.errors import UnsupportedOpError
from tests.support.conformance_batch import run_batched
from tests.support.targets import runnable

# op -> the pattern of its conformance cases (the `_expanded` function bodies are other ops' cases)
OP_CASES = {
    "GridSample": r"^test_gridsample",
    "RoiAlign": r"^test_roialign",
}


def _cases(node_tests: Path, op: str) -> list[str]:
    return [d for d in case_dirs(node_tests, OP_CASES[op]) if not d.endswith("_expanded")]


def _failures(results: dict[str, str]) -> list[str]:
    return [f"{name}: {status}" for name, status in sorted(results.items()) if status != "pass"]


@pytest.mark.parametrize("op", sorted(OP_CASES))
def test_conformance_ref(op: str, node_tests: Path) -> None:
    dirs = _cases(node_tests, op)
    assert dirs, f"no conformance cases for {op}"
    results = run_batched(dirs, "ref")
    assert len(results) == len(dirs)
    assert not _failures(results)
    assert op in CORE_OPS


@pytest.mark.slow
@pytest.mark.parametrize("target", runnable("native", "wasm32"))
def test_conformance_compiled(target: str, node_tests: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Every op's cases on a C target, in one build per opset."""
    dirs = [d for op in sorted(OP_CASES) for d in _cases(node_tests, op)]
    cache = request.getfixturevalue("wasm_cache") if target == "wasm32" else str(tmp_path)
    results = run_batched(dirs, target, cache_dir=cache)
    assert len(results) == len(dirs)
    assert not _failures(results)


# random inputs against the ONNX reference -------------------------------------------------------


def _model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], opset: int) -> onnx.ModelProto:
    elem = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}
    g = oh.make_graph([node], "g", [oh.make_tensor_value_info(k, elem[v.dtype], v.shape) for k, v in inputs.items()],
                      [oh.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in node.output])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])


def _check(model: onnx.ModelProto, inputs: dict[str, np.ndarray], expected: np.ndarray) -> None:
    got = list(cuvil.compile(model, target="ref")(*inputs.values()))[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


_GS = [(r, m, p, al) for r, m, p, al in itertools.product((2, 3), ("nearest", "linear", "cubic"),
                                                           ("zeros", "border", "reflection"), (0, 1))
       if not (r == 3 and m == "cubic")]


@pytest.mark.parametrize(("rank", "mode", "padding", "align"), _GS)
def test_grid_sample_random(rank: int, mode: str, padding: str, align: int) -> None:
    """Grid points up to four times beyond the input (reflections of reflections), every mode."""
    rng = np.random.default_rng(rank * 100 + len(mode) * 10 + len(padding) + align)
    xs, gs = ((2, 3, 5, 4), (2, 6, 7, 2)) if rank == 2 else ((2, 2, 3, 4, 5), (2, 3, 4, 2, 3))
    inputs = {"X": rng.standard_normal(xs).astype(np.float32), "G": rng.uniform(-4.5, 4.5, gs).astype(np.float32)}
    node = oh.make_node("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode=padding, align_corners=align)
    model = _model(node, inputs, 22)
    _check(model, inputs, ReferenceEvaluator(model).run(None, inputs)[0])


def test_grid_sample_opset16_names() -> None:
    """GridSample-16 names its modes bilinear and bicubic, and takes them as the same interpolation."""
    rng = np.random.default_rng(3)
    inputs = {"X": rng.standard_normal((1, 2, 4, 5)).astype(np.float32),
              "G": rng.uniform(-1.2, 1.2, (1, 3, 3, 2)).astype(np.float32)}
    for old, new in (("bilinear", "linear"), ("bicubic", "cubic"), ("nearest", "nearest")):
        m16 = _model(oh.make_node("GridSample", ["X", "G"], ["Y"], mode=old), inputs, 16)
        m20 = _model(oh.make_node("GridSample", ["X", "G"], ["Y"], mode=new), inputs, 20)
        _check(m16, inputs, ReferenceEvaluator(m20).run(None, inputs)[0])
    bad = _model(oh.make_node("GridSample", ["X", "G"], ["Y"], mode="linear"), inputs, 16)
    with pytest.raises(UnsupportedOpError, match="mode='linear'"):
        cuvil.compile(bad, target="ref")


def _rois(rng: np.random.Generator, n: int) -> np.ndarray:
    c = rng.uniform(-3, 11, (n, 4)).astype(np.float32)
    return np.stack([np.minimum(c[:, 0], c[:, 2]), np.minimum(c[:, 1], c[:, 3]),
                     np.maximum(c[:, 0], c[:, 2]), np.maximum(c[:, 1], c[:, 3])], 1)


@pytest.mark.parametrize(("opset", "mode", "ctm", "ratio"),
                         [(o, m, c, r) for o, m, c, r in itertools.product((10, 22), ("avg", "max"),
                                                                           ("half_pixel", "output_half_pixel"), (1, 3))
                          if not (o == 10 and c == "half_pixel")])
def test_roi_align_random(opset: int, mode: str, ctm: str, ratio: int) -> None:
    """ROIs partly outside the input, two images; RoiAlign-10 (no half-pixel shift) against onnxruntime,
    whose reference ONNX's evaluator lacks (it applies the newest default there)."""
    rng = np.random.default_rng(opset + ratio + len(mode) + len(ctm))
    inputs = {"X": rng.standard_normal((2, 3, 7, 9)).astype(np.float32), "rois": _rois(rng, 5),
              "b": rng.integers(0, 2, 5).astype(np.int64)}
    attrs: dict[str, object] = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio,
                                    spatial_scale=0.8)
    if opset > 10:
        attrs["coordinate_transformation_mode"] = ctm
    model = _model(oh.make_node("RoiAlign", ["X", "rois", "b"], ["Y"], **attrs), inputs, opset)
    if opset > 10:
        expected = ReferenceEvaluator(model).run(None, inputs)[0]
    else:
        ort = pytest.importorskip("onnxruntime")
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    _check(model, inputs, expected)


def test_roi_align_adaptive_sampling_refused() -> None:
    rng = np.random.default_rng(0)
    inputs = {"X": rng.standard_normal((1, 1, 4, 4)).astype(np.float32), "rois": _rois(rng, 2),
              "b": np.zeros(2, np.int64)}
    model = _model(oh.make_node("RoiAlign", ["X", "rois", "b"], ["Y"], sampling_ratio=0), inputs, 16)
    with pytest.raises(UnsupportedOpError, match="sampling_ratio=0"):
        cuvil.compile(model, target="ref")


"""The classic ONNX ops that model zoos still carry (LRN, ReverseSequence, Compress, MaxUnpool, LpPool, ...):
every ONNX conformance case of theirs passes on ref, native and wasm32, compared the way the ONNX backend
test runner compares (rtol 1e-3, atol 1e-7); the forms the conformance set leaves out
(tests/support/classic_cases.py) match onnxruntime or the operator's formula the same way; and the onnx
wheel's light model zoo networks that use LRN match their reference outputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import cuvil
from cuvil.conformance import ATOL, RTOL, case_dirs, compare
from cuvil.errors import ModelError, UnsupportedOpError
from tests.support.classic_cases import classic_cases, ort_outputs
from tests.support.node_batch import Case, failures, run_merged, stored_case
from tests.support.node_cases import symbolic_dims
from tests.support.paths import NODE_TESTS
from tests.support.single_node import one_node
from tests.support.targets import runnable

# Conformance case name stems (test_<stem>...) of the ops this file covers; the _expanded variants test
# ONNX's function bodies, which other ops' tests cover.
STEMS = ("lrn", "lppool", "maxunpool", "upsample", "mvn", "rms_normalization", "swish", "swiglu", "reversesequence",
         "compress", "center_crop_pad", "tensorscatter", "affine_grid", "hannwindow", "hammingwindow",
         "blackmanwindow", "bitwise", "bitshift", "cumprod", "det")
# Cases whose stored outputs follow ONNX's reference evaluator where it departs from the operator page and
# from onnxruntime: Cuvil follows the page, and these cases are compared with onnxruntime's outputs instead.
ORT_ORACLE = {
    # MaxUnpool's indices are linear in the output tensor; the reference scatters them into the shape
    # computed from the kernel (4x4 here) and pads that to output_shape (5x5).
    "test_maxunpool_export_with_output_shape",
}


def case_paths() -> list[str]:
    if not NODE_TESTS.is_dir():
        return []
    found = case_dirs(NODE_TESTS, rf"^test_({'|'.join(STEMS)})")
    return [c for c in found if "_expanded" not in c]


CASE_PATHS = case_paths()


def conformance_case(path: str) -> Case:
    """The stored case, or for ORT_ORACLE's cases the stored inputs with onnxruntime's outputs."""
    case = stored_case(path)
    if case.name in ORT_ORACLE:
        pytest.importorskip("onnxruntime")
        stored, case.expected = case.expected, ort_outputs(case.model, dict(zip(
            [vi.name for vi in case.model.graph.input], case.inputs)))
        assert compare(case.expected, stored) is not None  # the two oracles do differ here
    return case


@pytest.fixture(scope="module")
def extra_cases() -> dict[str, Case]:
    pytest.importorskip("onnxruntime")
    return {c.name: c for c in classic_cases()}


@pytest.mark.skipif(not CASE_PATHS, reason="conformance data not found beside the repo")
@pytest.mark.parametrize("path", CASE_PATHS, ids=os.path.basename)
def test_conformance_ref(path: str) -> None:
    summary = run_merged([conformance_case(path)], "ref")
    assert not failures(summary), failures(summary)


def test_symbolic_dims_ref() -> None:
    """The conformance cases with every float input dim above 1 made symbolic (the compositions' shape
    arithmetic on symbols): the same outputs, on one build of them all."""
    cases = []
    for path in CASE_PATHS:
        case = conformance_case(path)
        case.model, _ = symbolic_dims(case.model)
        cases.append(case)
    summary = run_merged(cases, "ref")
    assert not failures(summary), failures(summary)


def test_edge_cases_ref(extra_cases: dict[str, Case]) -> None:
    """The forms the conformance cases leave out (tests/support/classic_cases.py), against onnxruntime
    or the operator's formula."""
    assert len(extra_cases) >= 40
    summary = run_merged(list(extra_cases.values()), "ref")
    assert not failures(summary), failures(summary)


@pytest.mark.slow
@pytest.mark.skipif(not CASE_PATHS, reason="conformance data not found beside the repo")
@pytest.mark.parametrize("target", runnable("native", "wasm32"))
def test_c_targets(target: str, tmp_path: Path, extra_cases: dict[str, Case]) -> None:
    """Every conformance case and edge case of these ops, a few dozen to a build."""
    cases = [conformance_case(p) for p in CASE_PATHS] + list(extra_cases.values())
    summary = run_merged(cases, target, cache_dir=str(tmp_path))
    assert len(summary.results) == len(cases)
    assert not failures(summary), failures(summary)


F32 = np.zeros((1, 3, 4, 4), np.float32)


@pytest.mark.parametrize(("op", "inputs", "kw", "error", "match"), [
    ("LRN", {"x": F32}, {}, ModelError, "attribute 'size' is required"),
    ("LRN", {"x": F32}, {"size": 0}, ModelError, "size must be positive"),
    ("Upsample", {"x": F32, "s": np.ones(4, np.float32)}, {"opset": 10}, UnsupportedOpError, "deprecated"),
    ("Upsample", {"x": F32}, {"opset": 7, "scales": [1.0, 1.0, 0.5, 1.0]}, ModelError, "scales must be >= 1"),
    ("Upsample", {"x": F32}, {"opset": 7, "scales": [1.0, 1.0, 2.0, 2.0], "mode": "cubic"}, UnsupportedOpError,
     "mode 'cubic'"),
    ("LpPool", {"x": F32}, {"kernel_shape": [2, 2], "p": 0}, ModelError, "p must be positive"),
    ("MaxUnpool", {"x": F32, "i": F32.astype(np.int64)}, {}, ModelError, "kernel_shape"),
    ("Compress", {"x": F32, "c": np.ones((2, 2), bool)}, {}, ModelError, "condition must be 1-D"),
    ("ReverseSequence", {"x": F32, "l": np.ones(3, np.int64)}, {"batch_axis": 2}, ModelError, "batch_axis 2"),
    ("CenterCropPad", {"x": F32, "s": np.ones(3, np.int64)}, {"axes": [0, 1]}, ModelError, "3 values for 2 axes"),
    ("TensorScatter", {"p": F32, "u": F32}, {"axis": 0}, ModelError, "non-batch axis"),
    ("BitShift", {"a": np.ones(2, np.uint8), "b": np.ones(2, np.uint8)}, {"direction": "UP"}, ModelError,
     "direction must be LEFT or RIGHT"),
    ("BitwiseAnd", {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)}, {}, ModelError, "element type"),
    ("Det", {"x": np.ones((2, 3, 4), np.float32)}, {}, ModelError, "not square"),
    ("HannWindow", {"n": np.ones(2, np.int64)}, {}, ModelError, "size must be an int32 or int64 scalar"),
    ("Bernoulli", {"x": np.full(3, 0.5, np.float32)}, {}, UnsupportedOpError, "Bernoulli"),
])
def test_bad_uses_are_clear_errors(op: str, inputs: dict[str, np.ndarray], kw: dict[str, Any],
                                   error: type[Exception], match: str) -> None:
    kw = dict(kw)
    opset = kw.pop("opset", 22 if op not in ("Upsample", "BitShift") else 11)
    model = one_node(op, inputs, opset=opset, **kw)
    with pytest.raises(error, match=match):
        cuvil.compile(model, target="ref")


def test_lp_pool_ceil_mode_with_symbolic_dims_is_refused() -> None:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, "h", "w"])
    node = onnx.helper.make_node("LpPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    g = onnx.helper.make_graph([node], "g", [x], [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    with pytest.raises(UnsupportedOpError, match="ceil_mode=1 with symbolic spatial dims"):
        cuvil.compile(onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 18)]), target="ref")


# The onnx wheel's light model zoo ---------------------------------------------------------------------

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
LRN_NETWORKS = ("bvlc_alexnet", "inception_v1", "zfnet512")


def light_case(name: str) -> tuple[onnx.ModelProto, list[np.ndarray], list[np.ndarray]]:
    """A light zoo model with the inputs and expected outputs the ONNX backend test runner uses: every
    non-initializer input is ``arange(n) / n`` in its shape (unknown dims 1), the outputs are stored beside it."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    inits = {t.name for t in model.graph.initializer}
    inputs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in vi.type.tensor_type.shape.dim)
        n = int(np.prod(shape))
        inputs.append((np.arange(n).reshape(shape) / n).astype(np.float32))
    expected = [numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"light_{name}_output_{i}.pb")))
                for i in range(len(model.graph.output))]
    return model, inputs, expected


def with_lrn_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every LRN node's output as an extra graph output (after the model's own)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in model.graph.node:
        if n.op_type == "LRN":
            out.graph.output.append(onnx.helper.make_tensor_value_info(n.output[0], onnx.TensorProto.FLOAT, None))
    return out


@pytest.mark.slow
@pytest.mark.skipif(not LIGHT.is_dir(), reason="the onnx wheel has no light model zoo")
@pytest.mark.parametrize("target", runnable("ref", "native", "wasm32"))
@pytest.mark.parametrize("name", LRN_NETWORKS)
def test_light_zoo_lrn_networks(name: str, target: str, tmp_path: Path) -> None:
    """The network's output matches its stored reference as the ONNX backend test runner compares them.
    Their weights are constants (0.02), so the probabilities are uniform whatever LRN computes: the LRN
    nodes' own outputs are compared with onnxruntime's too."""
    model, inputs, expected = light_case(name)
    probed = with_lrn_outputs(model)
    n_lrn = len(probed.graph.output) - len(model.graph.output)
    assert n_lrn == 2
    compiled = cuvil.compile(probed, target=target, cache_dir=str(tmp_path))
    got = [np.asarray(a) for a in compiled(*inputs)]
    assert (RTOL, ATOL) == (1e-3, 1e-7)  # the runner's tolerances for these three networks
    assert compare(got[: len(expected)], expected) is None, compare(got[: len(expected)], expected)
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    sess = ort.InferenceSession(probed.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {vi.name: x for vi, x in zip([v for v in model.graph.input
                                          if v.name not in {t.name for t in model.graph.initializer}], inputs)}
    want = sess.run(None, feeds)[len(expected):]
    for g, w in zip(got[len(expected):], want):
        # The conv layers before an LRN round in their own order: near-cancelling sums differ by a few
        # float32 ulps of the layer's scale, so the absolute tolerance is relative to that scale.
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-6 * float(np.abs(w).max()))

"""The classic ONNX ops that model zoos still carry (LRN, ReverseSequence, Compress, MaxUnpool, LpPool, ...):
every ONNX conformance case of theirs passes on ref, native and wasm32, compared the way the ONNX backend
test runner compares (rtol 1e-3, atol 1e-7); edge cases the conformance set leaves out are checked against
onnxruntime; and the onnx wheel's light model zoo networks that use LRN match their reference outputs."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import cuvil
from cuvil.conformance import ATOL, RTOL, case_dirs, compare, load_case
from tests.support.node_batch import failures, run_merged
from tests.support.paths import NODE_TESTS
from tests.support.single_node import one_node, run_ort
from tests.support.targets import runnable

# Conformance case name stems (test_<stem>...) of the ops this file covers; the _expanded variants test
# ONNX's function bodies, which other ops' tests cover.
STEMS = ("lrn", "det", "cumprod", "bitwise", "bitshift", "lppool", "mvn", "rms_normalization", "swish", "swiglu", "upsample", "reversesequence", "compress",
         "center_crop_pad", "tensorscatter", "maxunpool", "hannwindow", "hammingwindow", "blackmanwindow")
# Cases whose stored outputs follow ONNX's reference evaluator where it departs from the operator page and
# from onnxruntime: Cuvil follows the page, and these cases are compared with onnxruntime's outputs instead.
ORT_ORACLE = {
    # MaxUnpool's indices are linear in the output tensor; the reference scatters them into the shape
    # computed from the kernel (4x4 here) and pads that to output_shape (5x5).
    "test_maxunpool_export_with_output_shape",
}


def classic_cases() -> list[str]:
    if not NODE_TESTS.is_dir():
        return []
    found = case_dirs(NODE_TESTS, rf"^test_({'|'.join(STEMS)})")
    return [c for c in found if "_expanded" not in c]


CASES = classic_cases()


def _name(case: str) -> str:
    return os.path.basename(case)


@pytest.fixture(scope="module")
def ort_outputs() -> dict[str, list[np.ndarray]]:
    """onnxruntime's outputs for the cases of ORT_ORACLE."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    out = {}
    for case in CASES:
        if _name(case) in ORT_ORACLE:
            model, inputs, stored = load_case(case)
            assert isinstance(model, onnx.ModelProto)
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            out[_name(case)] = sess.run(None, {vi.name: x for vi, x in zip(model.graph.input, inputs)})
            assert compare(out[_name(case)], stored) is not None  # the two oracles do differ here
    return out


@pytest.mark.skipif(not CASES, reason="conformance data not found beside the repo")
@pytest.mark.parametrize("case", CASES, ids=_name)
def test_conformance_ref(case: str, ort_outputs: dict[str, list[np.ndarray]]) -> None:
    summary = run_merged([case], "ref", expected=ort_outputs)
    assert not failures(summary), failures(summary)


@pytest.mark.slow
@pytest.mark.skipif(not CASES, reason="conformance data not found beside the repo")
@pytest.mark.parametrize("target", runnable("native", "wasm32"))
def test_conformance_c_targets(target: str, tmp_path: Path, ort_outputs: dict[str, list[np.ndarray]]) -> None:
    summary = run_merged(CASES, target, cache_dir=str(tmp_path), expected=ort_outputs)
    assert len(summary.results) == len(CASES)
    assert not failures(summary), failures(summary)


# LRN beyond the conformance cases ----------------------------------------------------------------------


def lrn_spec(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN as the ONNX operator page writes it, in float64, one channel at a time."""
    xd = x.astype(np.float64)
    channels = x.shape[1]
    square_sum = np.zeros_like(xd)
    for c in range(channels):
        lo, hi = max(0, c - (size - 1) // 2), min(channels - 1, c + size // 2)
        square_sum[:, c] = (xd[:, lo : hi + 1] ** 2).sum(axis=1)
    return (xd / (bias + alpha / size * square_sum) ** beta).astype(x.dtype)


@pytest.mark.parametrize(("shape", "size", "dtype"), [
    ((2, 7, 5), 4, np.float32),          # an even window: one channel more after than before
    ((1, 6, 3, 4, 2), 3, np.float32),    # 3-D spatial
    ((2, 8, 6, 5), 5, np.float32),
    ((2, 5), 1, np.float32),             # no spatial dims, a window of one
    ((1, 9, 4, 4), 5, np.float16),
])
def test_lrn_matches_oracles(shape: tuple[int, ...], size: int, dtype: type) -> None:
    """Against the operator's formula, and against onnxruntime where it runs the node (4-D, odd sizes).
    (The ONNX reference evaluator's LRN loops over the batch instead of the channels: not an oracle.)"""
    x = {"x": (np.random.default_rng(3).standard_normal(shape) * 3).astype(dtype)}
    attrs = {"size": size, "alpha": 2e-3, "beta": 0.6, "bias": 1.5}
    model = one_node("LRN", x, **attrs)  # type: ignore[arg-type]
    got = list(cuvil.compile(model, target="ref")(*x.values()))
    want = [lrn_spec(x["x"], size, 2e-3, 0.6, 1.5)]
    assert compare(got, want) is None, compare(got, want)
    if size % 2 and len(shape) == 4:
        pytest.importorskip("onnxruntime")
        ort = run_ort(model, x, got)
        assert compare(got, ort) is None, compare(got, ort)


def test_lrn_without_size_is_a_clear_error() -> None:
    model = one_node("LRN", {"x": np.zeros((1, 3, 2, 2), np.float32)})
    with pytest.raises(cuvil.CuvilError, match="size"):
        cuvil.compile(model, target="ref")


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
@pytest.mark.parametrize("target", runnable("ref", "native"))
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

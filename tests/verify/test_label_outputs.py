"""Integer outputs are compared by exact agreement; a label of an ArgMax/TopK picked among scores within
rounding of each other (a near-tie) is reported and excused, any other differing label fails."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil.faults
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.types import TensorType
from cuvil.verify.base import Status
from cuvil.verify.labels import LabelJudge, label_source
from tests.verify.models import context, f32, onnx_model, run


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


def test_a_flip_between_near_equal_scores_is_a_near_tie_and_any_other_flip_a_mismatch() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (3, 4)))
    labels = b.add1("arg_max", [x], {"axis": 1, "keepdims": 1}, node_name="pick")
    b.graph.outputs = [b.add1("reshape", [labels, b.constant(np.array([-1], np.int64))])]
    scores = np.array([[1.0, np.nextafter(np.float32(1.0), np.float32(2.0)), 0.0, 0.0],  # 1 ulp apart
                       [0.0, 5.0, 1.0, 0.0],
                       [2.0, 0.0, 0.0, 3.0]], np.float32)
    want = scores.argmax(axis=1)
    got = np.array([0, 2, 3])  # row 0 takes the other of the tied pair; row 1 a label scoring 1 against 5
    judge = LabelJudge(b.graph)
    assert label_source(b.graph, 0) is not None
    agree = judge.judge(0, "labels", got, want, [scores], tolerance=1e-5)
    assert (agree.elements, agree.near_ties, agree.mismatches) == (3, 1, 1)
    tie = next(e for e in agree.examples if e["kind"] == "near-tie")
    mismatch = next(e for e in agree.examples if e["kind"] == "mismatch")
    assert tie["index"] == [0] and tie["gap"] <= tie["within"]
    assert mismatch["index"] == [1] and (mismatch["got"], mismatch["want"]) == (2, 1)
    assert "1 of 3 elements differ" in agree.describe() and "1 near-ties" in agree.describe()
    assert judge.judge(0, "labels", want, want, [scores], 1e-5).describe() == "all 3 elements agree exactly"


def test_top_k_indices_are_judged_per_pick_and_an_integer_output_of_no_label_node_must_agree() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (2, 5)))
    n = b.input("n", TensorType(DType.i64, (2,)))
    _, idx = b.add("top_k", [x, b.constant(np.array([2], np.int64))], {"axis": 1}, num_outputs=2)
    b.graph.outputs = [idx, b.add1("add", [n, n])]
    scores = np.array([[9.0, 1.0, 4.0, 4.0, 0.0], [0.0, 1.0, 2.0, 3.0, 7.0]], np.float32)
    judge = LabelJudge(b.graph)
    got = np.array([[0, 3], [4, 3]])  # the second pick of row 0 swaps two equal scores
    agree = judge.judge(0, "idx", got, np.array([[0, 2], [4, 3]]), [scores, np.zeros(2, np.int64)], 1e-5)
    assert (agree.near_ties, agree.mismatches) == (1, 0) and agree.ok
    assert label_source(b.graph, 1) is None
    other = judge.judge(1, "sum", np.array([0, 3]), np.array([0, 2]), [scores, np.zeros(2, np.int64)], 1e-5)
    assert (other.near_ties, other.mismatches) == (0, 1)


def near_tie_model() -> onnx.ModelProto:
    """labels = argmax([x, (x / 3) * 3]) per row: the two scores are equal but for one rounding, which
    float32 and float64 make differently, so the label flips between them on many rows."""
    three = numpy_helper.from_array(np.array(3.0, np.float32), "three")
    nodes = [helper.make_node("Div", ["x", "three"], ["d"], name="third"),
             helper.make_node("Mul", ["d", "three"], ["y"], name="back"),
             helper.make_node("Concat", ["x", "y"], ["scores"], axis=1, name="both"),
             helper.make_node("ArgMax", ["scores"], ["labels"], axis=1, keepdims=0, name="pick")]
    out = helper.make_tensor_value_info("labels", TensorProto.INT64, [256])
    return onnx_model(nodes, [f32("x", [256, 1])], [out], [three])


def conv_labels_model() -> onnx.ModelProto:
    """labels = argmax over the 5 channels of a 3x3 convolution (pad 1): a wrong padding moves the border's scores."""
    w = numpy_helper.from_array(np.random.default_rng(3).standard_normal((5, 1, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("ArgMax", ["c"], ["labels"], axis=1, keepdims=0, name="pick")]
    out = helper.make_tensor_value_info("labels", TensorProto.INT64, [1, 8, 8])
    return onnx_model(nodes, [f32("x", [1, 1, 8, 8])], [out], [w])


@pytest.mark.slow
def test_near_ties_pass_cross_target_and_precision_and_are_reported(tmp_path: Path, cache: str) -> None:
    ctx = context(near_tie_model(), ["ref", "native"], tmp_path, cache)
    cross = run("cross-target", ctx, targets=["ref", "native"])[""]
    assert cross.status is Status.PASS, cross.summary
    assert cross.figures["near_ties"] > 0 and cross.figures["label_mismatches"] == 0  # the planted tie flips
    assert "near-ties" in cross.summary
    for target, r in run("precision", ctx, precisions=["fp32"]).items():
        assert r.status is Status.PASS, (target, r.summary)
        (row,) = r.details["outputs"]
        assert row["exact"] and row["mismatches"] == 0
    assert max(r.figures.get("near_ties", 0.0) for r in run("precision", ctx, precisions=["fp32"]).values()) > 0


@pytest.mark.slow
def test_a_real_label_mismatch_still_fails(tmp_path: Path, cache: str) -> None:
    with cuvil.faults.plant("conv-pad"):
        ctx = context(conv_labels_model(), ["ref", "native"], tmp_path, cache)
        cross = run("cross-target", ctx, targets=["ref", "native"])[""]
        precision = run("precision", ctx, precisions=["fp32"])
    assert cross.status is Status.FAIL and cross.where["target"] == "native", cross.summary
    assert cross.where["output"] == "labels" and "elements differ" in cross.summary
    assert cross.figures["label_mismatches"] > 0
    assert precision["ref"].status is Status.PASS
    assert precision["native"].status is Status.FAIL and "labels" in precision["native"].summary
    assert "agree exactly" in precision["native"].summary

"""IR-stability checks: passes, fusion-memory, control-flow (cuvil/verify/checks/).

Each check passes on correct models (the bundled tiny CNN, small ONNX models with If and Loop
built here) and fails, pointing at the right place, on a planted fault: a wrong epsilon in
BatchNorm folding (the pass), a C kernel that only exists after fusion corrupted (the pass a
bisection of the pipeline finds), an If that runs its else branch for a true condition (the
If node and branch), and an arena overlap in the memory plan (the build pair and output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
import cuvil.faults
import cuvil.verify.checks  # registers the checks
from cuvil.backends.c.kernel import _KERNELS, Kernel, KernelCtx
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.passes import Pass, PassResult
from cuvil.passes import base as passes_base
from cuvil.verify.base import Status
from cuvil.verify.render.json import write_json
from cuvil.verify.report import Report
from tests.support.paths import REPO
from tests.verify.models import context, f32, if_on_sum, onnx_model, residual_softmax, run

TINY_CNN = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


def if_on_input() -> onnx.ModelProto:
    """y = -x if c else x + x: the condition is a graph input."""
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"], name="neg")], "then", [], [f32("t", [3])])
    else_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["e"], name="double")], "else", [],
                               [f32("e", [3])])
    return onnx_model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
                  [helper.make_tensor_value_info("c", TensorProto.BOOL, []), f32("x", [3])], [f32("y", [3])])


def loop_with_if() -> onnx.ModelProto:
    """acc = x; n times: acc = acc * 0.5 + 1 when the iteration is even, acc - 1 otherwise; scans acc."""
    consts = [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in
              (("half", 0.5, np.float32), ("onef", 1.0, np.float32), ("two", 2, np.int64), ("zero", 0, np.int64))]
    then_g = helper.make_graph([helper.make_node("Mul", ["acc_in", "half"], ["m"], name="mul"),
                                helper.make_node("Add", ["m", "onef"], ["t"], name="inc")], "even", [], [f32("t", [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["acc_in", "onef"], ["e"], name="dec")], "odd", [],
                               [f32("e", [3])])
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two"], ["r"], name="mod"),
         helper.make_node("Equal", ["r", "zero"], ["even"], name="is_even"),
         helper.make_node("If", ["even"], ["acc_out"], name="step", then_branch=then_g, else_branch=else_g),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep"),
         helper.make_node("Identity", ["acc_out"], ["scan"], name="scan_id")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), f32("acc_in", [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), f32("acc_out", [3]), f32("scan", [3])])
    nodes = [helper.make_node("Loop", ["n", "", "x"], ["acc", "scans"], name="repeat", body=body)]
    return onnx_model(nodes, [helper.make_tensor_value_info("n", TensorProto.INT64, []), f32("x", [3])],
                  [f32("acc", [3]), f32("scans", ["k", 3])], tuple(consts))


def chain() -> onnx.ModelProto:
    """y = relu(x + c) * c: one fused_elementwise node once fuse-elementwise ran."""
    c = numpy_helper.from_array(np.float32([0.5, -1, 2, 0.25]), "c")
    nodes = [helper.make_node("Add", ["x", "c"], ["a"], name="add"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "c"], ["y"], name="mul")]
    return onnx_model(nodes, [f32("x", [2, 4])], [f32("y", [2, 4])], (c,))


# passes ------------------------------------------------------------------------------------------------
def test_passes_reports_every_pass_of_the_pipeline(tmp_path: Path, cache: str) -> None:
    res = run("passes", context(onnx.load(TINY_CNN), ["ref", "native"], tmp_path, cache))
    assert res["ref"].status is Status.SKIP
    r = res["native"]
    assert r.status is Status.PASS, r.summary
    rows = r.details["passes"]
    assert [row["text"] for row in rows] == r.details["pipeline"].split(",")
    assert "fold-batchnorm" in r.details["pipeline"]
    assert all(row["verified"] is True and row["max_error"] <= 1e-6 and row["seconds"] >= 0 for row in rows)
    assert r.figures["target_rel_l2"] < 1e-4 and not r.where


def test_passes_pins_a_wrong_batchnorm_epsilon_to_fold_batchnorm(tmp_path: Path, cache: str) -> None:
    with cuvil.faults.plant("bn-epsilon"):
        r = run("passes", context(onnx.load(TINY_CNN), ["native"], tmp_path, cache))["native"]
    assert r.status is Status.FAIL
    index = r.details["pipeline"].split(",").index("fold-batchnorm") + 1
    assert r.where == {"pass": "fold-batchnorm", "index": str(index)}
    assert r.details["blame"]["found_by"] == "numeric-each" and r.figures["max_pass_error"] > 1e-6
    stem = f"{index:03d}-fold-batchnorm.cir"
    before, after = r.details["attachments"][f"before-{stem}"], r.details["attachments"][f"after-{stem}"]
    assert "batch_norm(" in before and "batch_norm(" not in after
    assert print_graph(parse_graph(before)) == before  # parsable: `cuvil opt` can replay the pass
    # the JSON report writes the attachments beside it
    report = Report(model="tiny_cnn", targets=["native"], checks=["passes"], results=[r])
    write_json(report, tmp_path / "out" / "report.json")
    entry = json.loads((tmp_path / "out" / "report.json").read_text())["results"][0]
    files = entry["attachment_files"]
    assert (tmp_path / "out" / files[f"after-{stem}"]).read_text() == after


def test_passes_bisects_a_bug_that_shows_only_after_codegen(tmp_path: Path, cache: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # fused_elementwise exists only once fuse-elementwise ran: the interpreter sees nothing, the build is wrong
    real = _KERNELS["fused_elementwise"]

    def emit(k: KernelCtx) -> None:
        real.emit(k)
        k.w.line(f"{k.out().ptr}[0] += 1.0f;")

    monkeypatch.setitem(_KERNELS, "fused_elementwise", Kernel(emit, real.computes_shape))
    r = run("passes", context(chain(), ["native"], tmp_path, cache))["native"]
    assert r.status is Status.FAIL
    index = r.details["pipeline"].split(",").index("fuse-elementwise") + 1
    assert r.where == {"pass": "fuse-elementwise", "index": str(index)} and r.details["blame"]["found_by"] == "bisect"
    trail = {e["passes"]: e["rel_l2"] for e in r.details["bisect"]}
    assert trail[index] > 1e-4 and trail[index - 1] <= 1e-4 and trail[0] <= 1e-4
    assert "fused_elementwise" in r.details["attachments"][f"after-{index:03d}-fuse-elementwise.cir"]


@dataclass(frozen=True)
class _DropOutputProducer(Pass):
    """Removes the node computing the first output (a bug: the IR is left invalid)."""

    name: ClassVar[str] = "test-drop-output-producer"

    def run(self, graph: Graph) -> PassResult:
        graph.nodes = [n for n in graph.nodes if graph.outputs[0] not in n.outputs]
        return PassResult(graph, True)


def test_passes_names_a_pass_that_leaves_invalid_ir(tmp_path: Path, cache: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(passes_base._PASSES, _DropOutputProducer.name, _DropOutputProducer)
    ctx = context(if_on_input(), ["ref"], tmp_path, cache)
    r = run("passes", ctx, pipeline=f"canonicalize,{_DropOutputProducer.name},dce")["ref"]
    assert r.status is Status.FAIL and r.where == {"pass": _DropOutputProducer.name, "index": "2"}
    assert r.details["blame"]["found_by"] == "verify-each"
    assert [(row["ran"], row["verified"]) for row in r.details["passes"]] == [(True, True), (True, False),
                                                                               (False, None)]


# control-flow ----------------------------------------------------------------------------------------------
def test_control_flow_drives_both_branches_of_an_input_condition(tmp_path: Path, cache: str) -> None:
    res = run("control-flow", context(if_on_input(), ["ref", "native"], tmp_path, cache))
    for target in ("ref", "native"):
        r = res[target]
        assert r.status is Status.PASS, r.summary
        assert r.figures["branch_coverage"] == 1.0 and r.details["coverage"]["missing"] == []
    assert len(res["native"].details["runs"]) == 2 and all(not e["wrong_outputs"] for e in res["native"].details["runs"])


def test_control_flow_catches_an_if_running_the_wrong_branch(tmp_path: Path, cache: str) -> None:
    with cuvil.faults.plant("if-branch"):
        r = run("control-flow", context(if_on_sum(), ["native"], tmp_path, cache))["native"]
    assert r.status is Status.FAIL
    assert r.where["node"] == "big" and r.where["branch"] == "then"
    assert {"y.native", "y.reference"} == set(r.tensors)


def test_control_flow_covers_loop_trip_counts_and_nested_branches(tmp_path: Path, cache: str) -> None:
    r = run("control-flow", context(loop_with_if(), ["native"], tmp_path, cache), several=3)["native"]
    assert r.status is Status.PASS, r.summary
    covered = {tuple(x) for x in r.details["coverage"]["covered"]}
    assert {("repeat", "0"), ("repeat", "1"), ("repeat", "several"), ("step", "then"), ("step", "else")} <= covered
    trips = sorted({n for e in r.details["runs"] for n in e["trips"].get("repeat", [])})
    assert trips[:2] == [0, 1] and trips[-1] >= 2


def test_control_flow_warns_on_an_unreachable_branch(tmp_path: Path, cache: str) -> None:
    # a sum of squares is never below -1: the else branch cannot be driven
    r = run("control-flow", context(if_on_sum(threshold=-1.0), ["ref"], tmp_path, cache), budget=12)["ref"]
    assert r.status is Status.WARN and r.where == {"node": "big"}
    assert [tuple(m) for m in r.details["coverage"]["missing"]] == [("big", "else")]
    assert r.figures["inputs_tried"] == 12 and "not reached: big else" in r.summary


def test_control_flow_skips_a_model_without_control_flow(tmp_path: Path, cache: str) -> None:
    r = run("control-flow", context(onnx.load(TINY_CNN), ["ref"], tmp_path, cache))["ref"]
    assert r.status is Status.SKIP and "no if or loop" in r.summary


# fusion-memory ---------------------------------------------------------------------------------------------
def test_fusion_memory_builds_agree(tmp_path: Path, cache: str) -> None:
    res = run("fusion-memory", context(residual_softmax(), ["ref", "native"], tmp_path, cache))
    assert res["ref"].status is Status.SKIP
    r = res["native"]
    assert r.status is Status.PASS, r.summary
    pairs = {p["pair"]: p for p in r.details["pairs"]}
    assert set(pairs) == {"fused/unfused", "planned/unplanned", "poisoned/planned"}
    assert all(p["status"] == "pass" for p in pairs.values()), pairs
    assert "plan-memory{poison=true}" in pairs["poisoned/planned"]["pipelines"]["poisoned"]


def test_fusion_memory_catches_an_arena_overlap(tmp_path: Path, cache: str) -> None:
    with cuvil.faults.plant("arena-overlap"):
        r = run("fusion-memory", context(residual_softmax(), ["native"], tmp_path, cache))["native"]
    assert r.status is Status.FAIL
    assert r.where == {"output": "y", "pair": "planned/unplanned", "layer": "y", "node": "residual", "op": "add"}
    assert {"y.planned", "y.unplanned"} == set(r.tensors)


"""cuvil reduce: cuts, signatures, and a planted fault reduced to a small repro that replays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from cuvil.ir.parser import parse_graph
from cuvil.reduce.candidate import Space, record
from cuvil.reduce.run import load_graph, model_inputs
from cuvil.reduce.signature import FailureSignature, Outcome
from tests.reduce.models import conv_tower


def _space(tmp_path: Path) -> Space:
    path = tmp_path / "tower.onnx"
    onnx.save(conv_tower(), path)
    g = load_graph(str(path))
    return Space(g, record(g, model_inputs(g, None)))


def test_a_head_cut_feeds_recorded_values(tmp_path: Path) -> None:
    sp = _space(tmp_path)
    down = next(i for i in sp.work if sp.graph.nodes[i].name == "b3_down")
    text, inputs = sp.build(sp.cut([down]))
    g = parse_graph(text)
    assert [n.op for n in g.nodes if n.op != "constant"] == ["conv"]
    assert [v.name for v in g.inputs] == ["b2_out"]
    # the input is the original run's value at the cut, not a stand-in
    assert np.array_equal(inputs["b2_out"], sp.recorded[next(v for v in sp.recorded if v.name == "b2_out")])


def test_a_side_branch_becomes_constants(tmp_path: Path) -> None:
    sp = _space(tmp_path)
    mul = next(i for i in sp.work if sp.graph.nodes[i].name == "b0_mul")
    text, inputs = sp.build(sp.cut([mul], as_constants=True))
    g = parse_graph(text)
    assert not g.inputs and not inputs
    assert [n.op for n in g.nodes].count("constant") == 2


def test_signatures_match_by_kind_and_error() -> None:
    sig = FailureSignature.of("layerwise", "native", Outcome("mismatch", "y", {"rel_l2": 0.4}))
    assert sig.matches(Outcome("mismatch", "z", {"rel_l2": 0.01}))
    assert not sig.matches(Outcome("pass"))
    crash = FailureSignature("outputs", "native", "crash", error="SIGSEGV")
    assert crash.matches(Outcome("crash", error="SIGSEGV")) and not crash.matches(Outcome("crash", error="SIGABRT"))


@pytest.mark.slow
def test_a_planted_conv_stride_fault_reduces_and_replays(tmp_path: Path) -> None:
    from cuvil.reduce.repro import replay
    from cuvil.reduce.run import reduce_model

    path = tmp_path / "tower.onnx"
    onnx.save(conv_tower(), path)
    out = tmp_path / "repro"
    r = reduce_model(str(path), out, check="layerwise", target="native", faults=["conv-stride"],
                     cache_dir=str(tmp_path / "cache"))
    assert r.original_size > 20 and r.size <= 5
    assert {"model.cir", "inputs.npz", "expected.npz", "repro.json", "README.md"} <= {p.name for p in out.iterdir()}
    assert "b3_down" in (out / "model.cir").read_text()  # the strided conv the fault breaks is kept
    assert [n.op_type for n in onnx.load(out / "model.onnx").graph.node if n.op_type == "Conv"]
    assert replay(out)[0]  # the fault is planted: still fails
    assert not replay(out, faults=[])[0]  # fixed: passes


def test_the_reducible_checks_are_verify_checks() -> None:
    """Each name --check takes (beside ``outputs``, the plain comparison) is a check cuvil verify runs."""
    from cuvil.reduce.signature import CHECKS
    from cuvil.verify.base import all_checks
    from cuvil.verify.runner import load_builtin_checks

    load_builtin_checks()
    assert set(CHECKS) - {"outputs"} <= set(all_checks())


def test_a_candidate_that_hangs_or_dies_is_a_signature_not_the_end(tmp_path: Path) -> None:
    """Candidates run in children of the fork server: one past its timeout is killed (a hang), one
    that fails outright is a crash named by its last line of stderr, and the next still runs."""
    from cuvil.reduce.oracle import Job, judge, write_case

    case = tmp_path / "case"
    write_case(case, "this is not a graph", {}, Job("native"))
    assert judge(case, 0.001).kind == "hang"
    crashed = judge(case, 60.0)
    assert crashed.kind == "crash" and crashed.error and "Error" in crashed.error
    assert "not a graph" in (case / "stderr.txt").read_text() or crashed.message


@pytest.mark.slow
def test_a_hundred_node_model_reduces_to_the_faulty_conv(tmp_path: Path) -> None:
    from cuvil.reduce.run import reduce_model

    path = tmp_path / "tower.onnx"
    model = conv_tower(blocks=20, strided_at=10)
    assert len(model.graph.node) > 100
    onnx.save(model, path)
    r = reduce_model(str(path), tmp_path / "repro", check="layerwise", target="native", faults=["conv-stride"],
                     cache_dir=str(tmp_path / "cache"))
    assert r.original_size > 100 and r.size <= 5
    assert "b10_down" in (tmp_path / "repro" / "model.cir").read_text()


@pytest.mark.slow
def test_an_onnxruntime_disagreement_reduces_to_the_one_op(tmp_path: Path) -> None:
    from cuvil.reduce.repro import replay
    from cuvil.reduce.run import reduce_model
    from tests.reduce.models import argmax_chain

    pytest.importorskip("onnxruntime")
    path = tmp_path / "chain.onnx"
    onnx.save(argmax_chain(), path)
    out = tmp_path / "repro"
    r = reduce_model(str(path), out, check="outputs", subject="onnxruntime")
    assert r.original_size >= 10 and r.size == 1
    reduced = onnx.load(out / "model.onnx")
    assert [n.op_type for n in reduced.graph.node] == ["ArgMax"]
    assert replay(out)[0]

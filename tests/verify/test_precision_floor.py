"""The float32 bound follows the model: ``precision`` and ``cross-target`` judge a float32 build against the
model's own float32 error (the reference interpreter's float32 run against its float64 run), so an
ill-conditioned model passes on a correct build and a planted fault is still caught."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import cuvil.faults
import cuvil.verify.checks  # registers the checks
from cuvil.verify.base import CheckResult, Status, get_check
from cuvil.verify.context import ModelSource, VerifyContext
from tests.verify.models import f32, onnx_model


def cancelling_conv_bn() -> onnx.ModelProto:
    """conv -> BatchNormalization -> (+ 1e5) -> (- 1e5): the round trip through 1e5 costs every float32
    implementation about 1e-4 of relative error against float64, however correct."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.normal(0, 0.3, (8, 3, 3, 3))), ("scale", rng.uniform(0.5, 1.5, 8)), ("shift", rng.normal(0, 0.1, 8)),
        ("mean", rng.normal(0, 0.1, 8)), ("var", rng.uniform(1e-3, 4e-3, 8)), ("big", np.array(1e5)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn",
                              epsilon=1e-3),
             helper.make_node("Add", ["n", "big"], ["up"], name="up"),
             helper.make_node("Sub", ["up", "big"], ["y"], name="down")]
    return onnx_model(nodes, [f32("x", [1, 3, 8, 8])], [f32("y", [1, 8, 8, 8])], inits)


def _run(check: str, tmp_path: Path, targets: list[str], **options: object) -> list[CheckResult]:
    ctx = VerifyContext(ModelSource("onnx", cancelling_conv_bn()), targets=targets, cache_dir=str(tmp_path / "cache"),
                        work_dir=Path(tempfile.mkdtemp(dir=tmp_path)),
                        config={"checks": {check: {"targets": targets, **options}}})
    return get_check(check)().run(ctx)


@pytest.mark.slow  # builds the model for native twice (correct and with a planted fault): tens of seconds
def test_an_ill_conditioned_model_passes_and_a_planted_fault_is_caught(tmp_path: Path) -> None:
    results = {r.target: r for r in _run("precision", tmp_path, ["ref", "native"], precisions=["fp32"])}
    for r in results.values():
        assert r.status is Status.PASS, r.summary
        floor = r.figures["floor_rel_l2"]
        assert 2e-5 < floor < 1e-3 and r.figures["rel_l2"] > 1e-5  # the old fixed bound 1e-5 would fail it
        assert r.figures["bound"] == pytest.approx(8 * floor) and "float32 floor" in r.summary
    (x,) = _run("cross-target", tmp_path, ["ref", "native"])
    assert x.status is Status.PASS, x.summary
    assert x.figures["max_drift"] > 1e-5 and "own float32 error" in x.summary
    with cuvil.faults.plant("bn-epsilon"):
        bad = {r.target: r for r in _run("precision", tmp_path, ["native"], precisions=["fp32"])}["native"]
        (xbad,) = _run("cross-target", tmp_path, ["ref", "native"])
    assert bad.status is Status.FAIL and bad.where["output"] == "y", bad.summary
    assert bad.figures["rel_l2"] > bad.figures["bound"]
    assert xbad.status is Status.FAIL and xbad.where["target"] == "native", xbad.summary

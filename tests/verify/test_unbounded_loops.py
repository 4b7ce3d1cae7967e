"""The control-flow check warns about loops that may run without bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil.verify.checks  # noqa: F401  (registers the checks)
from cuvil.verify.base import Status
from tests.verify.models import context, f32, onnx_model, run


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


def _loop(trips: int | None, *, from_input: bool = False) -> onnx.ModelProto:
    """acc = x; doubled each iteration while i < 2 (the body's condition), under ``trips``."""
    consts = [numpy_helper.from_array(np.array(v, dt), name) for name, v, dt in
              (("two", 2.0, np.float32), ("stop", 2, np.int64))]
    body = helper.make_graph(
        [helper.make_node("Less", ["i", "stop"], ["go"], name="less"),
         helper.make_node("Mul", ["acc_in", "two"], ["acc_out"], name="dbl")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []), f32("acc_in", [3])],
        [helper.make_tensor_value_info("go", TensorProto.BOOL, []), f32("acc_out", [3])])
    inputs = [f32("x", [3])]
    if from_input:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.INT64, []))
        m = "m"
    elif trips is not None:
        consts.append(numpy_helper.from_array(np.array(trips, np.int64), "m"))
        m = "m"
    else:
        m = ""
    consts.append(numpy_helper.from_array(np.array(True), "start"))
    nodes = [helper.make_node("Loop", [m, "start", "x"], ["acc"], name="grow", body=body)]
    return onnx_model(nodes, inputs, [f32("acc", [3])], tuple(consts))


@pytest.mark.parametrize(("trips", "shown"), [(None, "no trip count"), (1 << 31, "a trip count of 2147483648"),
                                              (1 << 40, "a trip count of 1099511627776")])
def test_a_loop_that_may_run_without_bound_is_a_warning(tmp_path: Path, cache: str, trips: int | None,
                                                        shown: str) -> None:
    r = run("control-flow", context(_loop(trips), ["ref"], tmp_path, cache))["ref"]
    assert r.status is Status.WARN, r.summary
    assert r.where == {"node": "grow"}
    assert f"may run without bound: grow ({shown}" in r.summary and "max_loop_iterations" in r.summary
    assert len(r.details["unbounded_loops"]) == 1


@pytest.mark.parametrize("model", [_loop(5), _loop(None, from_input=True)], ids=["constant", "input"])
def test_a_bounded_trip_count_is_no_warning(tmp_path: Path, cache: str, model: onnx.ModelProto) -> None:
    r = run("control-flow", context(model, ["ref"], tmp_path, cache))["ref"]
    assert r.details["unbounded_loops"] == []
    assert "may run without bound" not in r.summary

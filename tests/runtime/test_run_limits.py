"""Run limits: max_loop_iterations and max_output_bytes, off by default, enforced per call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.cli import main
from cuvil.errors import CuvilError


def _counting_loop() -> onnx.ModelProto:
    """Loop(M) over a carried counter, scanning each iteration's f32[4] row: (count, rows[M, 4])."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["cc"]), helper.make_node("Add", ["n", "one"], ["n2"]),
         helper.make_node("Expand", ["fone", "four"], ["row"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("cc", TensorProto.BOOL, []),
         helper.make_tensor_value_info("n2", TensorProto.INT64, []),
         helper.make_tensor_value_info("row", TensorProto.FLOAT, [4])],
        [helper.make_tensor("one", TensorProto.INT64, [], [1]), helper.make_tensor("fone", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("four", TensorProto.INT64, [1], [4])],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "n0"], ["count", "rows"], name="loop0", body=body)], "g",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("n0", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("count", TensorProto.INT64, []),
         helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _feeds(trips: int) -> dict[str, np.ndarray]:
    return {"M": np.array(trips, np.int64), "n0": np.array(0, np.int64)}


@pytest.fixture(scope="module", params=["ref", "native"])
def model(request: pytest.FixtureRequest) -> cuvil.CompiledModel:
    return cuvil.compile(_counting_loop(), target=request.param)


def test_without_limits_the_loop_runs_its_trip_count(model: cuvil.CompiledModel) -> None:
    out = model.run(_feeds(50))
    assert int(out["count"]) == 50 and out["rows"].shape == (50, 4)


def test_max_loop_iterations(model: cuvil.CompiledModel) -> None:
    assert int(model.run(_feeds(5), max_loop_iterations=5)["count"]) == 5
    with pytest.raises(CuvilError, match=r"'?loop0'? \(loop\): runs more than 5 iterations \(max_loop_iterations\)"):
        model.run(_feeds(6), max_loop_iterations=5)
    # a trip count of 2^31 stops at the limit instead of running until killed
    with pytest.raises(CuvilError, match="runs more than 1000 iterations"):
        model.run(_feeds(1 << 31), max_loop_iterations=1000)
    assert int(model.run(_feeds(6))["count"]) == 6  # the limit was for that call only


def test_max_output_bytes(model: cuvil.CompiledModel) -> None:
    assert model.run(_feeds(4), max_output_bytes=64)["rows"].shape == (4, 4)  # 4 rows of 16 bytes
    with pytest.raises(CuvilError, match=r"'?loop0'? \(loop\): a value it builds .*(holds|hold) 80 bytes.* "
                                         r"max_output_bytes \(64\)"):
        model.run(_feeds(5), max_output_bytes=64)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_limits_must_be_positive_integers(model: cuvil.CompiledModel, bad: object) -> None:
    with pytest.raises(CuvilError, match="max_loop_iterations must be a positive integer"):
        model.run(_feeds(1), max_loop_iterations=bad)  # type: ignore[arg-type]


def test_cli_run_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "loop.onnx"
    onnx.save(_counting_loop(), str(path))
    feeds = tmp_path / "in.npz"
    np.savez(feeds, **_feeds(1 << 31))
    rc = main(["run", str(path), "-t", "native", "--inputs", str(feeds), "--max-loop-iterations", "100"])
    err = capsys.readouterr().err
    assert rc == 2 and "runs more than 100 iterations (max_loop_iterations)" in err and len(err.splitlines()) == 1

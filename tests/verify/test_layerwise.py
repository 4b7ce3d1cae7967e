"""How ``layerwise`` and ``batch-scaling`` compare tensors (cuvil.metrics' policy, through the checks' own
code), and which oracle ``layerwise`` uses when the model's framework is not installed."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from onnx import helper, numpy_helper

import cuvil.metrics
from cuvil.api import import_model
from cuvil.verify.base import Status, get_check
from cuvil.verify.checks import batch_scaling, layerwise
from cuvil.verify.checks.batch_scaling import BatchScaling
from cuvil.verify.checks.layerwise import REFERENCE_ORACLE, Layerwise, Oracle
from cuvil.verify.runner import run_check
from tests.verify.models import context, f32, onnx_model

NAN = math.nan


def _judge(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> Any:
    """Layerwise's verdict on crafted tap traces: one layer per value, in the order given."""
    layers = [(v, f"node_{v}", "add", f"src_{v}") for v in got]
    oracle = Oracle(want, {v: f"src_{v}" for v in want}, REFERENCE_ORACLE)
    return Layerwise({})._judge("ref", layers, got, [], oracle, 1e-4, {}, SimpleNamespace(graph=None))


def test_a_layer_with_a_shared_nan_and_an_error_elsewhere_fails() -> None:
    r = _judge({"a": np.array([1.0, 1.0]), "b": np.array([NAN, 2.0])},
               {"a": np.array([1.0, 1.0]), "b": np.array([NAN, 1.0])})
    assert r.status is Status.FAIL, r.summary
    assert r.where["layer"] == "b" and "relative L2 error 1 " in r.summary, r.summary
    first = r.details["series"][1]
    assert first["rel_l2"] == 1.0 and first["max_abs"] == 1.0, first


@pytest.mark.parametrize(("got", "want"), [
    ([NAN, 1.0], [NAN, 1.0]),
    ([np.inf, -np.inf, 1.0], [np.inf, -np.inf, 1.0]),
])
def test_layers_whose_non_finite_values_match_and_rest_agrees_pass(got: list[float], want: list[float]) -> None:
    r = _judge({"a": np.array(got)}, {"a": np.array(want)})
    assert r.status is Status.PASS, r.summary
    assert r.details["series"][0]["rel_l2"] == 0.0 and r.details["series"][0]["max_abs"] == 0.0


@pytest.mark.parametrize(("got", "want", "why"), [
    ([NAN, 1.0], [2.0, 1.0], "nan where the oracle has 2.0"),
    ([2.0, 1.0], [NAN, 1.0], "2.0 where the oracle has nan"),
    ([np.inf, 1.0], [-np.inf, 1.0], "inf where the oracle has -inf"),
])
def test_a_non_finite_value_on_one_side_is_an_infinite_error_with_its_place(got: list[float], want: list[float],
                                                                            why: str) -> None:
    r = _judge({"a": np.array(got)}, {"a": np.array(want)})
    assert r.status is Status.FAIL
    entry = r.details["series"][0]
    assert entry["rel_l2"] == math.inf and entry["max_abs"] == math.inf
    assert why in entry["problem"] and "index [0]" in entry["problem"], entry


def test_a_layer_of_another_shape_is_an_error() -> None:
    r = _judge({"a": np.zeros((2, 3))}, {"a": np.zeros((3, 2))})
    assert r.status is Status.FAIL and r.details["series"][0]["problem"] == "shape [2, 3] against the oracle's [3, 2]"


def test_batch_scaling_compares_with_the_same_policy() -> None:
    assert batch_scaling.relative_l2 is cuvil.metrics.relative_l2
    assert not hasattr(layerwise, "relative_l2")  # one copy, in cuvil.metrics
    proto = onnx_model([helper.make_node("Add", ["x", "k"], ["y"], name="add")], [f32("x", ["batch", 2])],
                       [f32("y", ["batch", 2])], [numpy_helper.from_array(np.ones((1, 2), np.float32), "k")])
    graph = import_model(proto)

    def model(x: np.ndarray) -> list[np.ndarray]:
        # a NaN at the same place in the batched and the single runs, and the batched run off elsewhere
        y = x + 1.0
        y[0, 0] = NAN
        if len(x) > 1:
            y[0, 1] += 1.0
        return [y]

    x = np.ones((4, 2), np.float32)
    err, where = BatchScaling._batch_agreement(model, graph, "batch", 1, [x])
    assert where == "y" and err == pytest.approx(0.5), err  # |2 + 1 - 2| / |2|, the NaN left out


# ---- a framework that is not installed -----------------------------------------------------------------------


def _conv() -> Any:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="act")]
    return onnx_model(nodes, [f32("x", [1, 3, 8, 8])], [f32("y", [1, 4, 8, 8])], [w])


def test_layerwise_without_onnxruntime_uses_the_reference_and_says_so(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime raises ImportError
    with pytest.raises(ImportError):
        import onnxruntime  # noqa: F401
    ctx = context(_conv(), ["ref"], tmp_path, str(tmp_path / "cache"))
    (r,) = run_check(get_check("layerwise")({}), ctx)
    assert r.status is Status.PASS, r.summary
    assert r.details["oracle"] == REFERENCE_ORACLE
    assert "onnxruntime is not installed" in r.details["oracle_fallback"]
    assert "onnxruntime is not installed" in r.summary and REFERENCE_ORACLE in r.summary
    assert r.details["series"] and all(e["rel_l2"] < 1e-6 for e in r.details["series"])


def test_precision_without_onnxruntime_uses_the_reference_and_says_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    ctx = context(_conv(), ["ref"], tmp_path, str(tmp_path / "cache"))
    (r,) = run_check(get_check("precision")({}), ctx)
    assert r.status is Status.PASS, r.summary
    assert "onnxruntime" in r.details["source_error"] and "cannot run the model" in r.summary


def test_layerwise_with_onnxruntime_uses_it(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    ctx = context(_conv(), ["ref"], tmp_path, str(tmp_path / "cache"))
    (r,) = run_check(get_check("layerwise")({}), ctx)
    assert r.status is Status.PASS and r.details["oracle"] == "onnxruntime", r.summary
    assert "oracle_fallback" not in r.details

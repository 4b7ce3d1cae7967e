"""cuvil verify on TensorFlow models: a file.py:factory returning a Keras model and its input spec,
and a SavedModel folder; the precision check's source oracle is TensorFlow, and layerwise names the
Keras layer of each layer it compares."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tensorflow", reason="the TensorFlow front end needs tensorflow (pip install 'cuvil[tensorflow]')")
pytest.importorskip("tf2onnx", reason="the TensorFlow front end needs tf2onnx (pip install 'cuvil[tensorflow]')")

import cuvil
from tests.frontends.tensorflow import models
from tests.support.paths import REPO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_factory_file_layerwise_names_keras_layers(tmp_path: Path) -> None:
    factory = tmp_path / "model.py"
    factory.write_text(f"""import sys
sys.path.insert(0, {str(REPO)!r})
import tensorflow as tf
from tests.frontends.tensorflow import models

def make():
    model, _ = models.build("mlp")
    return model, [tf.TensorSpec((None, 20), tf.float32)]
""", encoding="utf-8")
    report = cuvil.verify(f"{factory}:make", checks=["layerwise", "precision"], targets=["ref"])
    results = {r.check: r for r in report.results}
    assert report.exit_status == 0, report.verdict
    layerwise = results["layerwise"]
    assert "onnxruntime on tf2onnx's conversion" in layerwise.summary
    sources = [e["source_node"] for e in layerwise.details["series"]]
    assert any("(Keras layer hidden1)" in str(s) for s in sources), sources
    assert "TensorFlow (fp32)" in results["precision"].summary


def test_savedmodel_folder(tmp_path: Path) -> None:
    model, _ = models.build("mlp")
    saved = tmp_path / "saved"
    model.export(str(saved), verbose=False)
    report = cuvil.verify(str(saved), checks=["precision"], targets=["ref"])
    assert report.exit_status == 0, report.verdict
    assert "TensorFlow (fp32)" in report.results[0].summary

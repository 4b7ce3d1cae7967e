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
    model, _ = models.build("mobilenet")
    return model, [tf.TensorSpec((None, 16, 16, 3), tf.float32)]
""", encoding="utf-8")
    report = cuvil.verify(f"{factory}:make", checks=["layerwise", "precision"], targets=["ref"])
    assert report.exit_status == 0, report.verdict
    results = {r.check: r for r in report.results}
    layerwise = results["layerwise"]
    assert "against TensorFlow (per-layer outputs of the Keras model)" in layerwise.summary
    series = {str(e["source_node"]).split(" (")[0]: e for e in layerwise.details["series"]}
    # TensorFlow's NHWC outputs compared with the channels-first tensors tf2onnx made of them
    assert series["Keras layer pw1_relu6"]["shape"] == [1, 16, 8, 8]  # NHWC [1, 8, 8, 16] in TensorFlow
    assert {"Keras layer stem_relu6", "Keras layer pool", "Keras layer logits"} <= set(series)
    assert "TensorFlow (fp32)" in results["precision"].summary


def test_savedmodel_folder(tmp_path: Path) -> None:
    model, _ = models.build("mlp")
    saved = tmp_path / "saved"
    model.export(str(saved), verbose=False)
    report = cuvil.verify(str(saved), checks=["precision", "layerwise"], targets=["ref"])
    assert report.exit_status == 0, report.verdict
    results = {r.check: r for r in report.results}
    assert "TensorFlow (fp32)" in results["precision"].summary
    # a SavedModel has no Keras layers to tap: onnxruntime on tf2onnx's model, its name scopes shown
    assert "against onnxruntime on tf2onnx's conversion" in results["layerwise"].summary


@pytest.mark.slow
def test_layerwise_names_the_keras_layer_of_a_planted_bug(tmp_path: Path) -> None:
    import tensorflow as tf

    model, _ = models.build("resnet")
    spec = [tf.TensorSpec((None, 16, 16, 3), tf.float32)]
    with cuvil.faults.plant("conv-pad"):
        report = cuvil.verify(model, input_spec=spec, checks=["layerwise"], targets=["native"],
                              cache_dir=tmp_path / "cache")
    (result,) = report.results
    assert report.exit_status == 1 and result.status.value == "fail", result.summary
    assert result.where["source_node"].startswith("Keras layer stem_relu "), result.where
    assert "against TensorFlow (per-layer outputs of the Keras model)" in result.summary


@pytest.mark.slow
def test_layerwise_on_native_compares_the_channels_last_twins(tmp_path: Path) -> None:
    import tensorflow as tf

    model, _ = models.build("mobilenet")
    report = cuvil.verify(model, input_spec=[tf.TensorSpec((None, 16, 16, 3), tf.float32)], checks=["layerwise"],
                          targets=["native"], cache_dir=tmp_path / "cache")
    assert report.exit_status == 0, report.verdict
    series = report.results[0].details["series"]
    # the layout pass's NHWC twins, compared with TensorFlow's NHWC outputs as they are
    assert any(e["value"].endswith("_nhwc") and e["shape"] == [1, 8, 8, 16] for e in series), series

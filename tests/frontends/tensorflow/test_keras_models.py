"""Whole Keras models (built in code, tests/frontends/tensorflow/models.py) compiled on ref and
native against Keras itself: relative L2 error <= 1e-5 in float32 (cuvil.metrics), and one native
build run at two batch sizes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("tensorflow", reason="the TensorFlow front end needs tensorflow (pip install 'cuvil[tensorflow]')")
pytest.importorskip("tf2onnx", reason="the TensorFlow front end needs tf2onnx (pip install 'cuvil[tensorflow]')")

import cuvil
from cuvil.metrics import relative_l2
from tests.frontends.tensorflow import models

RTOL_L2 = 1e-5
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-keras-cache"))


def keras_outputs(model: Any, x: np.ndarray) -> np.ndarray:
    return np.asarray(model(x, training=False).numpy())


@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize("name", sorted(models.BUILDERS))
def test_matches_keras(name: str, target: str, cache_dir: str) -> None:
    model, x = models.build(name)
    m = cuvil.compile(model, target=target, cache_dir=cache_dir if target != "ref" else None)
    assert m.info.source_kind == "keras model"
    assert [str(s.shape[0]) for s in m.input_specs] == ["batch"]  # the leading None dim
    (got,) = m(x)
    want = keras_outputs(model, x)
    assert got.shape == want.shape and got.dtype == want.dtype
    err = relative_l2(got, want)
    assert err <= RTOL_L2, f"{name} on {target}: relative L2 error {err:.3g} > {RTOL_L2}"


def test_one_build_runs_two_batch_sizes(cache_dir: str) -> None:
    model, _ = models.build("mobilenet")
    m = cuvil.compile(model, target="native", cache_dir=cache_dir, dims={"batch": (1, 8)})
    rng = np.random.default_rng(1)
    for batch in (1, 5):
        x = models.sample(model, batch, rng)
        (got,) = m(x)
        assert got.shape == (batch, 5)
        assert relative_l2(got, keras_outputs(model, x)) <= RTOL_L2

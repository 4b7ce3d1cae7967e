"""End-to-end: PyTorch networks exported to ONNX, compiled for the reference target, checked against onnxruntime.

Each model is built in plain PyTorch (tests/support/zoo/networks.py), exported once per
session (exported.py), compiled with ``cuvil.compile(path, target="ref")`` and
run on seeded inputs.  The oracle is onnxruntime on the same ONNX file: every
fp32 output must be within a relative L2 error of 1e-5.  Eager PyTorch is a
second, looser check that the exported file still means what the module does.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import cuvil
from cuvil.ir.symbolic import DimExpr
from tests.support.exported import ModelStore, assert_outputs_close

TOL_ORT = 1e-5  # Cuvil ref vs onnxruntime on the same graph
# vs eager PyTorch: other kernels, and a graph the exporter rewrote (batch norm folded into Conv); the
# measured errors are below 5e-7 for every model, as are onnxruntime's own against PyTorch.
TOL_EAGER = 1e-5

STATIC = [
    "mlp",
    "transformer",
    pytest.param("torch_encoder", marks=pytest.mark.slow),
    pytest.param("mobilenet_v2", marks=pytest.mark.slow),
    pytest.param("resnet18", marks=pytest.mark.slow),
]


def check_model(models: ModelStore, name: str, batch: int, *, optimize: bool = True) -> None:
    em = models.get(name, optimize=optimize)
    m = cuvil.compile(em.path, target="ref")
    assert m.input_names == em.input_names()
    assert m.output_names == em.output_names()
    arrays = em.inputs(batch)
    got = m(*arrays)
    assert_outputs_close(got, em.onnxruntime(arrays), m.output_names, TOL_ORT, "onnxruntime")
    assert_outputs_close(got, em.eager(arrays), m.output_names, TOL_EAGER, "eager PyTorch")


@pytest.mark.parametrize("name", STATIC)
def test_model_matches_onnxruntime(models: ModelStore, name: str) -> None:
    check_model(models, name, batch=1)


@pytest.mark.slow
def test_unoptimized_export_matches_onnxruntime(models: ModelStore) -> None:
    """Without the exporter's optimiser the graph keeps BatchNormalization, Shape, Expand and CastLike."""
    em = models.get("mobilenet_v2", optimize=False)
    ops = {n.op_type for n in onnx.load(str(em.path), load_external_data=False).graph.node}
    assert {"BatchNormalization", "Conv", "Clip"} <= ops, ops  # the test is only worth it if BN is still there
    check_model(models, "mobilenet_v2", batch=1, optimize=False)


DYNAMIC = [
    "mlp",
    pytest.param("transformer", marks=pytest.mark.slow),  # its dynamic export takes seconds
    pytest.param("torch_encoder", marks=pytest.mark.slow),  # batch flows through Shape/Slice/Concat/Reshape
    pytest.param("mobilenet_v2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", DYNAMIC)
def test_symbolic_batch(models: ModelStore, name: str) -> None:
    """One compiled model, exported with a symbolic batch, runs batches 1 and 3."""
    em = models.get(name, dynamic=True)
    m = cuvil.compile(em.path, target="ref")
    batch_dim = m.input_specs[0].shape[0]
    assert isinstance(batch_dim, DimExpr) and not isinstance(batch_dim, int), m.input_specs[0]
    assert "batch" in m.symbols, m.symbols
    assert all(isinstance(d, int) for d in m.input_specs[0].shape[1:]), m.input_specs[0]
    for batch in (1, 3):
        arrays = em.inputs(batch)
        got = m(*arrays)
        assert got[0].shape[0] == batch
        assert_outputs_close(got, em.onnxruntime(arrays), m.output_names, TOL_ORT, f"onnxruntime (batch {batch})")
        assert_outputs_close(got, em.eager(arrays), m.output_names, TOL_EAGER, f"eager PyTorch (batch {batch})")


# The calling contract, on the small MLP ------------------------------------------------------------


@pytest.fixture(scope="module")
def mlp_static(models: ModelStore) -> cuvil.CompiledModel:
    return cuvil.compile(models.get("mlp").path, target="ref")


@pytest.fixture(scope="module")
def mlp_dynamic(models: ModelStore) -> cuvil.CompiledModel:
    return cuvil.compile(models.get("mlp", dynamic=True).path, target="ref")


def x32(*shape: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def test_run_returns_outputs_by_name(models: ModelStore, mlp_static: cuvil.CompiledModel) -> None:
    x = x32(1, 32)
    (name,) = mlp_static.input_names
    out = mlp_static.run({name: x})
    assert list(out) == mlp_static.output_names == models.get("mlp").output_names()
    (expected,) = mlp_static(x)
    np.testing.assert_array_equal(out[mlp_static.output_names[0]], expected)


def test_wrong_number_of_inputs(mlp_static: cuvil.CompiledModel) -> None:
    (name,) = mlp_static.input_names
    with pytest.raises(cuvil.InputError) as e:
        mlp_static(x32(1, 32), x32(1, 32))
    msg = str(e.value)
    assert repr(name) in msg and "expected 1 input" in msg and "got 2" in msg, msg
    with pytest.raises(cuvil.InputError, match=r"expected 1 input.*got 0"):
        mlp_static()


def test_wrong_dtype(mlp_static: cuvil.CompiledModel) -> None:
    (name,) = mlp_static.input_names
    with pytest.raises(cuvil.InputError) as e:
        mlp_static(x32(1, 32).astype(np.float64))
    msg = str(e.value)
    assert f"input {name!r}" in msg and "f32" in msg and "float64" in msg, msg


@pytest.mark.parametrize("fixture", ["mlp_static", "mlp_dynamic"])
def test_wrong_static_dim(request: pytest.FixtureRequest, fixture: str) -> None:
    m: cuvil.CompiledModel = request.getfixturevalue(fixture)
    (name,) = m.input_names
    with pytest.raises(cuvil.InputError) as e:
        m(x32(1, 31))
    msg = str(e.value)
    # names the input, the expected shape and dim, and what was given
    assert f"input {name!r}" in msg and "32]" in msg and "[1, 31]" in msg and "dim 1 must be 32" in msg, msg


def test_wrong_static_batch(mlp_static: cuvil.CompiledModel) -> None:
    (name,) = mlp_static.input_names
    with pytest.raises(cuvil.InputError) as e:
        mlp_static(x32(2, 32))
    msg = str(e.value)
    assert f"input {name!r}" in msg and "[1, 32]" in msg and "[2, 32]" in msg and "dim 0 must be 1" in msg, msg


def test_wrong_rank(mlp_dynamic: cuvil.CompiledModel) -> None:
    (name,) = mlp_dynamic.input_names
    with pytest.raises(cuvil.InputError) as e:
        mlp_dynamic(x32(32))
    msg = str(e.value)
    assert f"input {name!r}" in msg and "rank 2" in msg and "rank 1" in msg, msg


def test_run_with_wrong_names(mlp_static: cuvil.CompiledModel) -> None:
    (name,) = mlp_static.input_names
    with pytest.raises(cuvil.InputError) as e:
        mlp_static.run({"nope": x32(1, 32)})
    msg = str(e.value)
    assert f"missing {name!r}" in msg and "unknown 'nope'" in msg, msg

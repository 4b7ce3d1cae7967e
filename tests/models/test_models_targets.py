"""The zoo on the compiled targets: native C and WebAssembly, each against onnxruntime.

Same models, inputs and tolerance as the reference-target tests
(test_models_ref.py): relative L2 at most 1e-5 on every fp32 output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import cuvil
from tests.support.emulated import emulated, simde_include
from tests.support.exported import ModelStore, assert_outputs_close

# every test here builds a whole model for a C or wasm32 target (or under AVX-512 emulation): seconds to
# tens of seconds each, the slow tier
pytestmark = pytest.mark.slow

TOL_ORT = 1e-5


def _wasm_available() -> bool:
    try:
        import wasmtime  # noqa: F401
        import ziglang  # noqa: F401
    except ImportError:
        return False
    from cuvil.backends.registry import backend_names

    return "wasm32" in backend_names()


TARGETS = [
    "native",
    pytest.param("wasm32", marks=pytest.mark.skipif(not _wasm_available(), reason="wasm toolchain not installed")),
]
STATIC = [
    "mlp",
    "transformer",
    pytest.param("torch_encoder", marks=pytest.mark.slow),
    pytest.param("mobilenet_v2", marks=pytest.mark.slow),
    pytest.param("resnet18", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuvil-cache")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", STATIC)
def test_model_matches_onnxruntime(models: ModelStore, cache: Path, name: str, target: str) -> None:
    em = models.get(name)
    m = cuvil.compile(em.path, target=target, cache_dir=str(cache))
    arrays = em.inputs(1)
    assert_outputs_close(m(*arrays), em.onnxruntime(arrays), m.output_names, TOL_ORT, f"onnxruntime ({target})")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["mlp", "transformer", pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_symbolic_batch_one_build(models: ModelStore, cache: Path, name: str, target: str) -> None:
    """One build serves every batch size: nothing is recompiled per shape."""
    em = models.get(name, dynamic=True)
    m = cuvil.compile(em.path, target=target, cache_dir=str(cache))
    for batch in (1, 3, 2):
        arrays = em.inputs(batch)
        got = m(*arrays)
        assert got[0].shape[0] == batch
        assert_outputs_close(got, em.onnxruntime(arrays), m.output_names, TOL_ORT, f"{target} batch {batch}")


@pytest.mark.skipif(simde_include() is None, reason="simde-py (SIMDe's headers) is not installed")
@pytest.mark.parametrize("name", STATIC[1:])  # the mlp's products are the transformer's too
def test_model_on_avx512_under_emulation_matches_onnxruntime(models: ModelStore, cache: Path, tmp_path: Path,
                                                              name: str) -> None:
    """The x86_avx512 build's kernels, run under emulation where this CPU lacks AVX-512
    (tests/support/emulated.py)."""
    em = models.get(name)
    m = emulated(cuvil.compile(em.path, target="x86_avx512", cache_dir=str(cache)), tmp_path)
    arrays = em.inputs(1)
    assert_outputs_close(m(*arrays), em.onnxruntime(arrays), m.output_names, TOL_ORT, "onnxruntime (x86_avx512)")

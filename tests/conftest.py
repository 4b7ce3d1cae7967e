"""Fixtures every test directory may use, and the suite's command-line options (``--update-golden``).
Shared helpers and locations live in tests/support."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.paths import NODE_TESTS


@pytest.fixture(scope="session")
def node_tests() -> Path:
    """The ONNX node conformance cases laid beside the repository."""
    if not NODE_TESTS.is_dir():
        pytest.skip(f"conformance data not found at {NODE_TESTS}")
    return NODE_TESTS


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files from the current output")


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def wasm_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private build cache for wasm32 compiles (zig's library cache is the machine's: see
    ``cuvil.backends.wasm.toolchain.zig_global_cache``)."""
    return str(tmp_path_factory.mktemp("wasm-cache"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip, with the reason, on a machine without a CUDA GPU or without nvcc."""
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    from cuvil.backends.cuda.toolchain import find_nvcc, gpu_missing, missing_nvcc

    why = gpu_missing() or (None if find_nvcc() else missing_nvcc())
    if why:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=why))

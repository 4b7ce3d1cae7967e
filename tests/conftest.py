"""Shared test fixtures and locations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cuvil.verify.runner import target_unavailable

REPO = Path(__file__).resolve().parents[1]
NODE_TESTS = REPO.parent / "shared" / "onnx-node-tests" / "node"


def runnable(*targets: str) -> list[Any]:
    """``targets`` as pytest parameters, each skipped where this machine cannot run it (a C target
    whose instructions this CPU lacks, wasm32 without its packages), with the reason."""
    return [pytest.param(t, marks=pytest.mark.skipif(target_unavailable(t) is not None,
                                                     reason=f"{t}: {target_unavailable(t)}")) for t in targets]


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

"""Shared test fixtures and locations."""

from __future__ import annotations

import os
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


def pytest_configure(config: pytest.Config) -> None:
    # Every wasm32 build of the run, whatever its Cuvil cache, shares one zig cache kept in pytest's
    # cache: zig builds wasi-libc there once (tens of seconds cold) and locks its entries, so
    # sessions may share it. Compiled models stay in each test's own Cuvil cache.
    if config.cache is not None and "ZIG_GLOBAL_CACHE_DIR" not in os.environ:
        os.environ["ZIG_GLOBAL_CACHE_DIR"] = str(config.cache.mkdir("cuvil-zig"))


@pytest.fixture(scope="session")
def wasm_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private build cache for wasm32 compiles (zig's cache is shared: see pytest_configure)."""
    return str(tmp_path_factory.mktemp("wasm-cache"))

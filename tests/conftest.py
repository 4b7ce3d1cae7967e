"""Shared test fixtures and locations."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NODE_TESTS = REPO.parent / "shared" / "onnx-node-tests" / "node"


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

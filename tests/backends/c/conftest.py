"""Fixtures of the C backend's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build cache the session's kernel tests share (a test module may define its own)."""
    return tmp_path_factory.mktemp("cuvil-cache")

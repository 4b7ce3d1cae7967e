"""Fixtures of the verification tests: the runner's test checks registered alone, and a small MLP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cuvil.verify import base
from cuvil.verify.runner import load_builtin_checks
from tests.support.verify_checks import TEST_CHECKS, write_mlp


@pytest.fixture
def test_checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Only tests/support/verify_checks.py's checks are registered while a test runs (the real ones are
    loaded first, so they register into the real registry, which comes back afterwards)."""
    load_builtin_checks()
    monkeypatch.setattr(base, "_CHECKS", {c.name: c for c in TEST_CHECKS})
    yield


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return write_mlp(tmp_path / "mlp.onnx")

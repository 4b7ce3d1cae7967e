"""Fixtures of the model tests: the zoo exported to ONNX once per session."""

from __future__ import annotations

import pytest

from tests.support.exported import ModelStore


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    return ModelStore(tmp_path_factory.mktemp("zoo"))

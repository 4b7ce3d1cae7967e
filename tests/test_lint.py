"""ruff and mypy are configured in pyproject.toml and clean."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed (it is in the test extra)")
    r = subprocess.run(["ruff", "check", "cuvil", "tests", "examples"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_mypy_clean() -> None:
    r = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert r.returncode == 0, r.stdout[-5000:] + r.stderr

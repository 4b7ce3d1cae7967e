"""Shared test fixtures and locations."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def assert_clean_under_sanitizers(code: str, *args: str) -> None:
    """Runs ``code`` (with ``args``) in a Python child with AddressSanitizer and UBSan preloaded, for
    the libraries it builds with their checks; the child must print "clean", and no sanitizer may
    report.  Skips where the C compiler has no sanitizer runtimes."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    libs = [subprocess.run(["cc", f"-print-file-name={n}"], capture_output=True, text=True).stdout.strip()
            for n in ("libasan.so", "libubsan.so")]
    if not all(os.path.isabs(p) for p in libs):
        pytest.skip("the C compiler has no sanitizer runtimes")
    env = dict(os.environ, LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1", PYTHONPATH=str(REPO))
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=900)
    assert r.returncode == 0 and "clean" in r.stdout, r.stderr[-3000:]
    assert "AddressSanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr[-3000:]


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

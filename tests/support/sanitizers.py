"""Running code under AddressSanitizer and UBSan in a Python child (for the libraries it builds with
their checks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.paths import REPO


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

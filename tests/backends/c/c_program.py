"""Small C programs that drive the runtime headers directly: compiled strictly, then run."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cuvil.backends.c.toolchain import RUNTIME_DIR


def run_c_program(folder: Path, name: str, source: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Compile ``source`` (C11, every warning an error, the runtime headers on the include path)
    into ``folder/name`` and run it; the compile must succeed, the run's result is returned."""
    src, exe = folder / f"{name}.c", folder / name
    src.write_text(source)
    cc = subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{RUNTIME_DIR}", str(src),
                         "-o", str(exe), "-lm", "-pthread"], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout)

"""Compiling generated C to a WebAssembly module with the C compiler of the ``ziglang`` package.

``python -m ziglang cc`` is clang with wasi-libc bundled, installed from PyPI:
no system toolchain is needed. The module is a WASI *reactor* (a library:
``_initialize`` runs the C constructors once, then the host calls exports
any number of times) exporting the model API of ``cuvil_api.h`` and its
linear memory.

Zig keeps compiled C libraries (wasi-libc, compiler-rt) in its own cache;
the first build in an empty cache takes tens of seconds, later builds a
fraction of a second. There is one such cache for the machine, ``zig/`` in
the default Cuvil cache (``~/.cache/cuvil/zig``), shared by every build cache;
where that folder cannot be made or written (a read-only HOME), it is ``zig/``
in the build's own cache, so builds work with any HOME. Each model's own
object file goes to a throw-away local cache: the Cuvil cache already keeps
the module, and zig's would otherwise grow with every model.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cuvil.backends.c.cache import default_cache_dir
from cuvil.backends.c.toolchain import RUNTIME_DIR, WARN_FLAGS, BuildError
from cuvil.errors import CuvilError

# The functions a host calls (documented in docs/wasm.md). cuvil_load is left out: it reads
# a file, and a wasm host hands the weights over in memory (cuvil_load_from_memory).
EXPORTS = (
    "cuvil_malloc",
    "cuvil_free",
    "cuvil_load_from_memory",
    "cuvil_unload",
    "cuvil_num_inputs",
    "cuvil_num_outputs",
    "cuvil_run",
)

# The shadow stack of C (locals whose address is taken, arrays). Zig puts it first in linear
# memory, below the static data, so an overflow runs off address 0 and traps instead of
# overwriting data. 8 MiB is the usual native thread stack.
STACK_SIZE = 8 << 20

# -ffp-contract=off and -fno-math-errno as on the C targets, so results match them;
# -s drops debug info (about 1 MB of wasi-libc's).
BASE_FLAGS = ("--target=wasm32-wasi", "-mexec-model=reactor", "-std=c11", "-O2", "-msimd128", "-ffp-contract=off",
              "-fno-math-errno", "-s")


def compile_flags() -> list[str]:
    """Every flag of a build but the source and output paths."""
    return [*BASE_FLAGS, *WARN_FLAGS, f"-I{RUNTIME_DIR}", f"-Wl,-z,stack-size={STACK_SIZE}",
            *(f"-Wl,--export={name}" for name in EXPORTS)]


def _require_ziglang() -> None:
    if importlib.util.find_spec("ziglang") is None:
        raise CuvilError("the wasm32 target needs the 'ziglang' package (pip install 'cuvil[wasm]')")


@dataclass(frozen=True)
class Zig:
    """The ``ziglang`` package's compiler, run by the Python interpreter it is installed in."""

    python: str = sys.executable

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.python, "-m", "ziglang")

    @functools.cached_property
    def version(self) -> str:
        _require_ziglang()
        try:
            out = subprocess.run([*self.argv, "version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CuvilError(f"zig cannot run: {exc}") from None
        if out.returncode != 0 or not out.stdout.strip():
            raise CuvilError(f"zig failed to report its version: {out.stderr.strip()[:300]}")
        return f"zig {out.stdout.strip()}"


def zig_global_cache(cuvil_cache: Path) -> Path:
    """Where zig keeps its compiled C libraries: ``zig/`` in the default Cuvil cache, one for the
    machine, or ``zig/`` in the build cache ``cuvil_cache`` where that one cannot be made or written."""
    shared = default_cache_dir() / "zig"
    try:
        shared.mkdir(parents=True, exist_ok=True)
        if os.access(shared, os.W_OK | os.X_OK):
            return shared
    except OSError:
        pass
    return cuvil_cache / "zig"


def build_wasm(zig: Zig, source: Path, out: Path, zig_cache: Path) -> str:
    """Compile one generated source file into a WebAssembly module; returns the compiler's warnings."""
    _require_ziglang()
    zig_cache.mkdir(parents=True, exist_ok=True)
    cmd = [*zig.argv, "cc", *compile_flags(), str(source), "-o", str(out)]
    # The global cache keeps the C libraries for every build; the model's own object file goes to a
    # local cache thrown away afterwards (the Cuvil cache already keeps the module).
    with tempfile.TemporaryDirectory(prefix="cuvil-zig-") as local:
        env = dict(os.environ, ZIG_GLOBAL_CACHE_DIR=str(zig_cache), ZIG_LOCAL_CACHE_DIR=local)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(f"zig cc failed to run: {exc}") from None
    if r.returncode != 0:
        raise BuildError(f"WebAssembly compilation failed (zig cc):\n{r.stderr[-4000:]}")
    return r.stderr

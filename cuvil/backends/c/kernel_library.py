"""The kernel library: the runtime's model-independent code, compiled once per compiler and flags.

Most of the time a model's build spends in the C compiler goes to code that does not depend on
the model: the GEMM (its micro-kernels, packing, the small-product kernels), the thread pool,
strided view copies, fused attention and the channels-last convolutions.
So that code is compiled once per (compiler, flags, runtime headers) into a position-independent
object in the build cache, ``kernels/<key>/cuvil_kernels.o``, and every model library of those
flags links it.  The model's own unit includes the same headers with ``CUVIL_KERNEL_LIBRARY=1``:
it declares the library's functions and defines only the model's code (``cuvil_rt.h`` says how
the headers split).  The library's symbols are hidden, so each model library carries its own copy
of the code it uses (unused sections are dropped at link time) and exports only its API, as
before; nothing is shared between loaded models.

A saved artifact's ``model.c`` still compiles alone (``CUVIL_KERNEL_LIBRARY`` defaults to 0: one
unit defines everything): the rebuild command in its ``meta.json`` needs no library.  The code is
the same either way, and since the build passes ``-ffp-contract=off`` and no fast-math flag, the
split changes no result.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cuvil._version import __version__
from cuvil.backends.c import cache
from cuvil.backends.c.toolchain import RUNTIME_DIR, Compiler, run_compiler

# The headers whose functions the library defines (CUVIL_LIB in them), in include order.
LIBRARY_HEADERS = ("cuvil_rt.h", "cuvil_threads.h", "cuvil_gemm.h", "cuvil_index.h", "cuvil_attention.h",
                   "cuvil_nhwc_direct.h", "cuvil_conv_nhwc.h")
OBJECT = "cuvil_kernels.o"
# Each function and object in its own section, so a model's link keeps only what it calls.
_LIBRARY_FLAGS = ("-DCUVIL_KERNEL_LIBRARY=2", "-ffunction-sections", "-fdata-sections")


def library_source() -> str:
    """The library's one translation unit."""
    return "".join(f'#include "{h}"\n' for h in LIBRARY_HEADERS)


def object_flags(flags: list[str]) -> list[str]:
    """The flags that compile the library's object from a model library's ``flags``: the same
    code generation, compiled to an object (``-c``) rather than linked into a shared library."""
    return [f for f in flags if f != "-shared"] + list(_LIBRARY_FLAGS)


def kernel_object(compiler: Compiler, flags: list[str], root: Path) -> Path:
    """The library's object for model libraries compiled with ``compiler`` and ``flags``: from the
    build cache under ``root`` (or the default cache, where it is already built), else compiled
    into ``root`` (once, whichever process asks first)."""
    lib_flags = object_flags(flags)
    h = hashlib.sha256()
    for part in (__version__, compiler.version, *compiler.argv, "\0", *lib_flags, cache.runtime_digest(RUNTIME_DIR)):
        h.update(part.encode())
        h.update(b"\0")

    def make(folder: Path) -> None:
        src = folder / "cuvil_kernels.c"
        src.write_text(library_source(), encoding="utf-8")
        cmd = [*compiler.argv, *lib_flags, "-c", str(src), "-o", str(folder / OBJECT)]
        log = run_compiler(cmd, "the kernel library")
        (folder / "build.log").write_text(log, encoding="utf-8")

    key = h.hexdigest()
    # A library is a function of its key alone, so one that the default cache already holds serves
    # a build whose own cache folder has none yet (a fresh cache_dir); it is linked, not copied.
    for home in (root, cache.default_cache_dir()):
        found = cache.lookup(home / "kernels", key)
        if found is not None and (found / OBJECT).is_file():
            return found / OBJECT
    entry, _ = cache.get_or_build(root / "kernels", key, make)
    return entry / OBJECT

"""The C targets' entries in the backend table: ``generic``, ``x86_avx2``, ``x86_avx512`` and
``native``, one :class:`CBackend` each, named by the toolchain's flag table (``TARGET_FLAGS``)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.backends.c.toolchain import TARGET_FLAGS, TARGET_ISA, cpu_cannot_run, int8_products
from cuvil.backends.registry import Backend, register_backend
from cuvil.log import stage

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions

_log = logging.getLogger(__name__)


class CBackend(Backend):
    """C source compiled with the system C compiler (``cc=``) into a shared library, loaded with
    ctypes; ``sanitize=`` builds it with AddressSanitizer and UBSan.  ``native`` builds for this
    machine's CPU; the x86 targets for every CPU with their features (a build for a CPU this one
    is not is made and saved, not loaded)."""

    family_label: ClassVar[str] = "C"
    summary: ClassVar[str] = "runs C compiled with the system C compiler"
    is_c: ClassVar[bool] = True
    uses_system_cc: ClassVar[bool] = True
    supports_threads: ClassVar[bool] = True
    chooses_conv_algorithm: ClassVar[bool] = True
    saves_artifacts: ClassVar[bool] = True
    toolchain: ClassVar[str] = "builds with the system C compiler (cc=)"

    def check_options(self, options: CompileOptions) -> None:
        from cuvil.backends.c.kernels.conv_algorithm import normalize

        normalize(options.build.conv_algorithm)

    def kernel_ops(self) -> frozenset[str]:
        import cuvil.backends.c.kernels  # noqa: F401  (fills the kernel table)
        from cuvil.backends.c.kernel import kernel_ops

        return frozenset(kernel_ops())

    def required_features(self) -> frozenset[str]:
        return TARGET_ISA.get(self.name, frozenset())

    def cannot_run_here(self) -> str | None:
        return cpu_cannot_run(self.name)

    def unavailable(self) -> str | None:
        if shutil.which("cc") is None:  # cuvil.compile's default compiler
            return "no C compiler (cc) found"
        return cpu_cannot_run(self.name, unreadable="this CPU's features cannot be read (/proc/cpuinfo)")

    def reduce_range_default(self) -> bool:
        return int8_products(self.name) == "bytes"

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        from cuvil.backends.c import BuildOptions, CExecutor, build
        from cuvil.backends.c.kernels.conv_algorithm import normalize
        from cuvil.backends.c.toolchain import Compiler

        b = options.build
        built = build(graph, BuildOptions(target=self.name, compiler=Compiler.from_string(b.cc),
                                          cache_dir=Path(b.cache_dir) if b.cache_dir else None, sanitize=b.sanitize,
                                          conv_algorithm=normalize(b.conv_algorithm), faults=options.faults,
                                          options_key=build_key))
        unloadable = self.cannot_run_here()
        if unloadable:
            _log.warning("%s: built, not loaded: %s; save it (CompiledModel.save, cuvil compile -o) and run it on a "
                         "CPU that has them", self.name, unloadable)
        with stage(_log, "load", times):
            return CExecutor(built, num_threads=b.num_threads, unloadable=unloadable)


for _name in TARGET_FLAGS:
    register_backend(CBackend(_name))

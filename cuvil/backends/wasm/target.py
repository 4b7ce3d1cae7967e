"""The ``wasm32`` target's entry in the backend table: the C backend's code, compiled by ``zig cc``
to wasm32 + SIMD128 and run by wasmtime."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.backends.registry import Backend, register_backend
from cuvil.log import stage

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions

_log = logging.getLogger(__name__)

#: The Python packages the target needs: the compiler and the runtime.
PACKAGES = ("ziglang", "wasmtime")


class WasmBackend(Backend):
    """WebAssembly: the generated C of the C backend, unchanged, built with zig cc (not the system
    compiler, so ``cc=`` and ``sanitize=`` do not apply) and run in one thread by wasmtime; it runs
    on any machine that has the two packages."""

    family_label: ClassVar[str] = "wasm32"
    summary: ClassVar[str] = "runs WebAssembly in wasmtime"
    chooses_conv_algorithm: ClassVar[bool] = True
    saves_artifacts: ClassVar[bool] = True
    toolchain: ClassVar[str] = "builds with zig cc"

    def check_options(self, options: CompileOptions) -> None:
        from cuvil.backends.c.kernels.conv_algorithm import normalize

        normalize(options.build.conv_algorithm)

    def kernel_ops(self) -> frozenset[str]:
        import cuvil.backends.c.kernels  # noqa: F401  (fills the kernel table)
        from cuvil.backends.c.kernel import kernel_ops

        return frozenset(kernel_ops())

    def unavailable(self) -> str | None:
        missing = [m for m in PACKAGES if importlib.util.find_spec(m) is None]
        return f"needs the Python packages {', '.join(missing)}" if missing else None

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        from cuvil.backends.c.kernels.conv_algorithm import normalize
        from cuvil.backends.wasm import WasmBuildOptions, WasmExecutor
        from cuvil.backends.wasm import build as build_wasm

        cache_dir = options.build.cache_dir
        with stage(_log, "wasm build", times):
            wb = build_wasm(graph, WasmBuildOptions(cache_dir=Path(cache_dir) if cache_dir else None,
                                                    conv_algorithm=normalize(options.build.conv_algorithm),
                                                    faults=options.faults, options_key=build_key))
        with stage(_log, "load", times):
            return WasmExecutor(wb)


WASM32 = register_backend(WasmBackend("wasm32"))

"""The CUDA targets' entries in the backend table: ``cuda`` (a fat binary for sm_80 and sm_90 plus
PTX), ``cuda:sm_80``, ``cuda:sm_90``, ``cuda-sim`` (the same generated source built with the host
C++ compiler against the CPU execution harness, run on the CPU) and ``hip`` (the same source and
its hipcc build command, saved with ``cuvil compile -t hip -o DIR``)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cuvil.backends.registry import Backend, register_backend
from cuvil.log import stage

if TYPE_CHECKING:
    from cuvil.ir.graph import Graph
    from cuvil.options import CompileOptions

_log = logging.getLogger(__name__)
_NOT_YET_PASSES = frozenset({"convert-layout", "fuse-attention"})


class CudaBackend(Backend):
    """CUDA C from the CUDA code generator, built by nvcc (one instance per architecture set)."""

    family_label: ClassVar[str] = "CUDA"
    summary: ClassVar[str] = "runs CUDA built by nvcc on an NVIDIA GPU"
    saves_artifacts: ClassVar[bool] = True
    toolchain: ClassVar[str] = "builds with the CUDA toolkit's nvcc"
    gpus: ClassVar[int] = 1
    # cross-target compares the CUDA targets when asked (--targets ref,cuda-sim): their kernels do not
    # yet cover every model (docs/cuda.md), and a model they refuse is not a drift
    compared_by_default: ClassVar[bool] = False

    def kernel_ops(self) -> frozenset[str]:
        from cuvil.backends.cuda.kernel import device_ops, host_ops

        return device_ops() | host_ops()

    def unsupported_ops(self) -> frozenset[str]:
        from cuvil.backends.cuda.kernel import NOT_YET_SUPPORTED

        return NOT_YET_SUPPORTED

    def default_pipeline(self, *, enable_fusion: bool = True) -> str:
        from cuvil.backends.pipelines import standard_pipeline

        # The passes whose ops have no CUDA kernel yet (conv_nhwc, attention) are left out.
        text = standard_pipeline(enable_fusion=enable_fusion)
        return ",".join(p for p in text.split(",") if p not in _NOT_YET_PASSES)

    def cannot_run_here(self) -> str | None:
        from cuvil.backends.cuda.toolchain import gpu_missing

        return gpu_missing()

    def unavailable(self) -> str | None:
        from cuvil.backends.cuda.toolchain import find_nvcc, gpu_missing, missing_nvcc

        if find_nvcc() is None:
            return missing_nvcc()
        return gpu_missing()

    def build(self, graph: Graph, options: CompileOptions, *, build_key: str, times: dict[str, float]) -> Any:
        from cuvil.backends.cuda import CudaBuildOptions, CudaExecutor, build, build_facts

        cache_dir = options.build.cache_dir
        with stage(_log, "cuda build", times):
            b = build(graph, CudaBuildOptions(target=self.name, cache_dir=Path(cache_dir) if cache_dir else None,
                                              faults=options.faults, options_key=build_key),
                      compile_it=self.compiles)
        unloadable = self.cannot_run_here()
        if unloadable and not self.compiles:
            _log.info("%s: the source is written, not built: %s", self.name, unloadable)
        elif unloadable:
            _log.warning("%s: built, not loaded: %s; save it (CompiledModel.save, cuvil compile -o) and run it on a "
                         "machine that has one", self.name, unloadable)
        with stage(_log, "load", times):
            return CudaExecutor(b, build_facts(self.name, self.compiles), unloadable=unloadable)

    #: It compiles the source here (hip writes it with its build command).
    compiles: ClassVar[bool] = True


class CudaSimBackend(CudaBackend):
    """The CUDA target's generated source, unchanged, built with the host C++ compiler against the
    CPU execution harness (``cuvil_cuda_sim.h``: threads of a block as fibers, shared memory, warp
    shuffles) and run on the CPU with the same call interface: only the execution model is emulated."""

    summary: ClassVar[str] = "runs the CUDA target's source on the CPU under the execution harness"
    toolchain: ClassVar[str] = "builds with the host C++ compiler against the CUDA execution harness"
    runs_as: ClassVar[str] = "the CUDA execution harness (emulated)"
    gpus: ClassVar[int] = 0

    def cannot_run_here(self) -> str | None:
        return None

    def unavailable(self) -> str | None:
        from cuvil.backends.cuda.toolchain import find_host_cxx, harness_header

        if find_host_cxx() is None:
            return "no host C++ compiler (c++, g++ or clang++) found"
        if not harness_header().is_file():
            return f"the CUDA execution harness ({harness_header().name}) is not installed"
        return None


class HipBackend(CudaBackend):
    """The CUDA target's source for ROCm: written with its hipcc build command (``cuvil compile -t hip
    -o DIR``); not built or run here, and untested on AMD hardware."""

    summary: ClassVar[str] = "writes the CUDA source for ROCm with its hipcc build command"
    toolchain: ClassVar[str] = "is built by hipcc from the saved artifact"
    compiles: ClassVar[bool] = False
    gpus: ClassVar[int] = 0

    def cannot_run_here(self) -> str | None:
        return "hip builds are written with their hipcc command, not built or run by Cuvil (untested on AMD GPUs)"

    def unavailable(self) -> str | None:
        if shutil.which("hipcc") is None:
            return "hipcc (ROCm) was not found; cuvil compile -t hip -o DIR still writes the source and its build command"
        return self.cannot_run_here()


for _name in ("cuda", "cuda:sm_80", "cuda:sm_90"):
    register_backend(CudaBackend(_name))
CUDA_SIM = register_backend(CudaSimBackend("cuda-sim"))
HIP = register_backend(HipBackend("hip"))

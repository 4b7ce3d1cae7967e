"""The CUDA targets' toolchains: nvcc (found on PATH, else under a toolkit folder), the host C++
compiler for the CPU execution harness, hipcc for ROCm; their flags; and whether this machine has a GPU.

Where nvcc is not on PATH it is looked for in the toolkit folders of :data:`TOOLKIT_HOMES`:
``/usr/local/cuda`` (where NVIDIA's installers put it), after any folder added with
:func:`add_toolkit_home` (the command line adds ``$CUDA_HOME``: ``cuvil/commands/common.py``, the
one place the environment is read)."""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
from pathlib import Path

from cuvil.backends.c.toolchain import RUNTIME_DIR as C_RUNTIME_DIR
from cuvil.backends.c.toolchain import run_compiler
from cuvil.errors import CuvilError

RUNTIME_DIR = Path(__file__).parent / "runtime"
INCLUDE_DIRS = (RUNTIME_DIR, C_RUNTIME_DIR)  # cuvil_api.h and cuvil_vmath.h are the C runtime's

# The device code each nvcc target builds: a fat binary of SASS per architecture, plus PTX of the
# newest for GPUs after it (plain ``cuda``).
ARCH_FLAGS: dict[str, tuple[str, ...]] = {
    "cuda": ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=[sm_90,compute_90]"),
    "cuda:sm_80": ("-gencode=arch=compute_80,code=[sm_80,compute_80]",),
    "cuda:sm_90": ("-gencode=arch=compute_90,code=[sm_90,compute_90]",),
}
NVCC_FLAGS = ("-x", "cu", "-std=c++17", "-O3", "--shared", "-Xcompiler=-fPIC,-fvisibility=hidden", "-Werror=all-warnings",
              "-fmad=false")
# -O2: the harness's kernels run about 2.5x faster than under -O1, for a longer compile.
SIM_FLAGS = ("-std=c++17", "-O2", "-pthread", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off",
             "-DCUVIL_CUDA_SIM", "-x", "c++")
HIP_FLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-fvisibility=hidden", "-ffp-contract=off", "-x", "hip")


class CudaBuildError(CuvilError):
    """nvcc, hipcc or the host compiler rejected generated CUDA code (a Cuvil bug: please report it)."""


# Toolkit folders searched for bin/nvcc, first to last, where nvcc is not on PATH.
TOOLKIT_HOMES: list[str] = ["/usr/local/cuda"]


def add_toolkit_home(path: str) -> None:
    """Search the CUDA toolkit folder ``path`` for nvcc before the others (PATH still comes first)."""
    if path and path not in TOOLKIT_HOMES:
        TOOLKIT_HOMES.insert(0, path)


def find_nvcc() -> str | None:
    """nvcc on PATH, else ``<toolkit>/bin/nvcc`` of the first of :data:`TOOLKIT_HOMES` that has it;
    None when none does."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in TOOLKIT_HOMES:
        candidate = Path(home) / "bin" / "nvcc"
        if candidate.is_file():
            return str(candidate)
    return None


def missing_nvcc() -> str:
    where = "on PATH" + "".join(f" or in {h}/bin" for h in TOOLKIT_HOMES)
    return f"the CUDA toolkit's nvcc was not found ({where}; the command line also looks in $CUDA_HOME/bin)"


def find_host_cxx() -> str | None:
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def harness_header() -> Path:
    """The CPU execution harness the ``cuda-sim`` target builds against."""
    return RUNTIME_DIR / "cuvil_cuda_sim.h"


@functools.cache
def gpu_missing() -> str | None:
    """Why this machine cannot run CUDA code (no driver, no device), or None when it has a GPU."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "this machine has no CUDA GPU (the NVIDIA driver, libcuda.so.1, is not installed)"
    try:
        if lib.cuInit(0) != 0:
            return "this machine has no usable CUDA GPU (cuInit failed)"
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
            return "this machine has no CUDA GPU (the driver sees no device)"
    except AttributeError:
        return "this machine's libcuda.so.1 is not an NVIDIA driver"
    return None


def include_flags() -> list[str]:
    return [f"-I{d}" for d in INCLUDE_DIRS]


def command(target: str, compiler: str, source: Path, out: Path, *, artifact: bool = False) -> list[str]:
    """The command that builds ``source`` into the library ``out`` for ``target`` (``artifact``: its
    headers beside the source, as in a saved artifact, not in the installed runtime)."""
    includes = ["-I."] if artifact else include_flags()
    if target in ARCH_FLAGS:
        flags = [*NVCC_FLAGS, *ARCH_FLAGS[target]]
    elif target == "cuda-sim":
        flags = list(SIM_FLAGS)
    elif target == "hip":
        flags = list(HIP_FLAGS)
    else:
        raise CuvilError(f"unknown CUDA target {target!r}")
    return [compiler, *flags, *includes, str(source), "-o", str(out)]


def compiler_for(target: str) -> str:
    """The compiler ``target`` builds with, or a CuvilError saying which is missing."""
    if target in ARCH_FLAGS:
        nvcc = find_nvcc()
        if nvcc is None:
            raise CuvilError(f"target {target}: {missing_nvcc()}")
        return nvcc
    if target == "cuda-sim":
        cxx = find_host_cxx()
        if cxx is None:
            raise CuvilError("target cuda-sim: no host C++ compiler (c++, g++ or clang++) found")
        return cxx
    if target == "hip":
        return shutil.which("hipcc") or "hipcc"
    raise CuvilError(f"unknown CUDA target {target!r}")


@functools.cache
def compiler_version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CuvilError(f"{compiler} cannot run: {exc}") from None
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown"


def build_library(target: str, source: Path, out: Path) -> str:
    """Compile one generated CUDA source into a shared library; returns the compiler's warnings."""
    cmd = command(target, compiler_for(target), source, out)
    return run_compiler(cmd, f"the generated CUDA for {target}", timeout=1800, error=CudaBuildError)

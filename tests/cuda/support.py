"""What the CUDA tests share: small graphs per kernel family, compiling a graph's CUDA source, and
nvcc on generated source."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import cuvil
from cuvil.backends.cuda import toolchain
from cuvil.ir.parser import parse_graph

GRAPHS = {
    "elementwise": """graph main(%x: f32[n, 4], %b: f32[4], %c: f32[n, 1]) {
  symbol n in 1..64
  %a = add(%x, %b) : f32[n, 4]
  %r = relu(%a) : f32[n, 4]
  %e = exp(%r) : f32[n, 4]
  %m = mul(%e, %c) : f32[n, 4]
  %t = tanh(%m) : f32[n, 4]
  %w = greater(%t, %x) : bool[n, 4]
  %s = where(%w, %t, %b) : f32[n, 4]
  %f = flatten(%s) {axis = 0} : f32[1, 4*n]
  return %f, %a
}
""",
    "linalg": """graph main(%x: f32[n, 8], %w: f32[8, 5], %c: f32[5], %q: f32[2, n, 8], %r: f32[8, 3]) {
  symbol n in 1..64
  %a = gemm(%x, %w, %c) : f32[n, 5]
  %g = sigmoid(%a) : f32[n, 5]
  %m = matmul(%q, %r) : f32[2, n, 3]
  return %g, %m
}
""",
    "rows": """graph main(%x: f32[n, 5], %q: f32[2, n, 8]) {
  symbol n in 1..64
  %s = softmax(%x) {axis = -1} : f32[n, 5]
  %l = log_softmax(%x) {axis = 0} : f32[n, 5]
  %t = reduce_sum(%q) {keepdims = 0} : f32[]
  %u = reduce_max(%q) {keepdims = 1} : f32[1, 1, 1]
  return %s, %l, %t, %u
}
""",
}


def graph(name: str) -> cuvil.ir.graph.Graph:  # type: ignore[name-defined]
    return parse_graph(GRAPHS[name])


def cuda_source(model: object, tmp: Path) -> Path:
    """The generated CUDA of ``model`` (through the ``hip`` target, which writes the source and runs no compiler)."""
    m = cuvil.compile(model, target="hip", cache_dir=str(tmp / "cache"))
    return m.build_info.source  # type: ignore[union-attr]


def nvcc() -> str | None:
    return toolchain.find_nvcc()


SHIM = """#include <cuda_runtime.h>
#define CUVIL_LAUNCH(k, g, b, s, st, ...) k<<<g, b, s, st>>>(__VA_ARGS__)
#define CUVIL_DYNAMIC_SHARED(t, n) extern __shared__ t n[]
"""


def nvcc_check(source: Path, tmp: Path, arch: str = "sm_90") -> subprocess.CompletedProcess[str]:
    """nvcc -arch=ARCH -Werror all-warnings on ``source`` (device and host code, no link).

    Includes the installed cuvil_cuda.h where the runtime has it, else the two macros it defines
    for nvcc over the CUDA runtime header."""
    exe = nvcc()
    assert exe is not None
    shim_dir = tmp / "shim"
    includes = [f"-I{d}" for d in toolchain.INCLUDE_DIRS]
    if not (toolchain.RUNTIME_DIR / "cuvil_cuda.h").is_file():
        shim_dir.mkdir(exist_ok=True)
        (shim_dir / "cuvil_cuda.h").write_text(SHIM, encoding="utf-8")
        includes.insert(0, f"-I{shim_dir}")
    cmd = [exe, "-x", "cu", "-std=c++17", f"-arch={arch}", "-Werror", "all-warnings", "-c", *includes, str(source),
           "-o", str(tmp / "model.o")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def harness_missing() -> str | None:
    if not toolchain.harness_header().is_file():
        return "the CUDA execution harness (cuvil_cuda_sim.h) is not installed"
    if shutil.which("c++") is None:
        return "no host C++ compiler"
    return None

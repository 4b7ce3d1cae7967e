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
    "movement": """graph main(%x: f32[n, 3, 4], %y: f32[n, 2, 4], %i: i64[5]) {
  symbol n in 1..64
  %t = transpose(%x) {perm = [2, 0, 1]} : f32[4, n, 3]
  %c = concat(%x, %y) {axis = 1} : f32[n, 5, 4]
  %s0 = constant() {value = dense<i64[2]> [1, -1]} : i64[2]
  %e0 = constant() {value = dense<i64[2]> [5, -4]} : i64[2]
  %a0 = constant() {value = dense<i64[2]> [1, 2]} : i64[2]
  %p0 = constant() {value = dense<i64[2]> [1, -1]} : i64[2]
  %s = slice(%c, %s0, %e0, %a0, %p0) : f32[n, 4, 3]
  %g = gather(%x, %i) {axis = 2} : f32[n, 3, 5]
  %pp = constant() {value = dense<i64[6]> [0, 1, 2, 0, 0, 1]} : i64[6]
  %pd = pad(%x, %pp) {mode = "reflect"} : f32[n, 4, 7]
  %sh = constant() {value = dense<i64[4]> [2, 1, 3, 4]} : i64[4]
  %ex = expand(%x, %sh) : f32[2, n, 3, 4]
  return %t, %s, %g, %pd, %ex
}
""",
    "norm": """graph main(%x: f32[n, 6], %s: f32[6], %b: f32[6], %im: f32[n, 2, 5, 5]) {
  symbol n in 1..64
  %l = layer_norm(%x, %s, %b) {axis = -1, epsilon = 1e-05} : f32[n, 6]
  %m = max_pool(%im) {kernel_shape = [2, 2], strides = [2, 2], pads = [0, 0, 1, 1]} : f32[n, 2, 3, 3]
  %a = average_pool(%im) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], count_include_pad = 1} : f32[n, 2, 5, 5]
  %a2 = average_pool(%im) {kernel_shape = [3, 3], pads = [1, 1, 1, 1]} : f32[n, 2, 5, 5]
  %g = global_average_pool(%im) : f32[n, 2, 1, 1]
  return %l, %m, %a, %a2, %g
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

"""Prints the speed of ``cuvil_sgemm`` (GFLOP/s) for a few sizes and targets, checked against NumPy.

Usage: ``python benchmarks/gemm.py [--target native] [--reps 5]``.  The runtime header is compiled
with the same flags a model of that target gets; every result is compared with ``A @ B`` before
it is timed, so a fast but wrong kernel does not print a number.
"""

from __future__ import annotations

import argparse
import ctypes
import tempfile
import time
from pathlib import Path

import numpy as np

from cuvil.backends.c.toolchain import Compiler, build_library
from cuvil.metrics import max_abs_error

HARNESS = r"""
#include "cuvil_gemm.h"
CUVIL_EXPORT int bench_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t rsa, int64_t csa,
                             const float *B, int64_t rsb, int64_t csb, float beta, float *C, int reps) {
    for (int r = 0; r < reps; r++)
        if (cuvil_sgemm(M, N, K, 1.0f, A, rsa, csa, B, rsb, csb, beta, C, N)) return -1;
    return 0;
}
"""

# (M, N, K): square sizes, and the GEMMs of ResNet-18's convolutions (M = channels, N = pixels).
SIZES = [
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (64, 3136, 576),
    (128, 784, 1152),
    (256, 196, 2304),
    (512, 49, 4608),
]


def load(target: str, folder: Path) -> ctypes.CDLL:
    src = folder / f"bench_{target}.c"
    src.write_text(HARNESS)
    lib = folder / f"bench_{target}.so"
    build_library(Compiler(), src, lib, target)
    dll = ctypes.CDLL(str(lib))
    i64, fp = ctypes.c_int64, ctypes.c_void_p
    dll.bench_sgemm.argtypes = [i64, i64, i64, fp, i64, i64, fp, i64, i64, ctypes.c_float, fp, ctypes.c_int]
    dll.bench_sgemm.restype = ctypes.c_int
    return dll


def run(dll: ctypes.CDLL, m: int, n: int, k: int, reps: int, transpose_a: bool = False) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    c = np.zeros((m, n), dtype=np.float32)
    a_store = np.ascontiguousarray(a.T) if transpose_a else a
    rsa, csa = (1, m) if transpose_a else (k, 1)

    def call(count: int) -> None:
        rc = dll.bench_sgemm(m, n, k, a_store.ctypes.data, rsa, csa, b.ctypes.data, n, 1, 0.0, c.ctypes.data, count)
        if rc:
            raise MemoryError("cuvil_sgemm: out of memory")

    call(1)
    want = a.astype(np.float64) @ b.astype(np.float64)
    err = max_abs_error(c, want) / (float(np.max(np.abs(want))) + 1e-30)
    if err > 1e-4:
        raise AssertionError(f"cuvil_sgemm {m}x{n}x{k}: relative error {err:.2e}")
    t0 = time.perf_counter()
    call(reps)
    dt = (time.perf_counter() - t0) / reps
    return 2.0 * m * n * k / dt / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", action="append", help="C target(s); default: generic and native")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    targets = args.target or ["generic", "native"]
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            dll = load(target, Path(tmp))
            print(f"target {target}")
            for m, n, k in SIZES:
                gflops = run(dll, m, n, k, args.reps)
                print(f"  M={m:5d} N={n:5d} K={k:5d}  {gflops:7.1f} GFLOP/s")
            gflops = run(dll, 512, 512, 512, args.reps, transpose_a=True)
            print(f"  M=  512 N=  512 K=  512  {gflops:7.1f} GFLOP/s  (A transposed)")


if __name__ == "__main__":
    main()

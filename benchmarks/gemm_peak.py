"""GEMM micro-benchmark: Cuvil's fp32 GEMM in GFLOP/s next to this machine's measured FMA peak.

Usage: ``python benchmarks/gemm_peak.py`` (square 256..2048 and transformer shapes, 1 and 2
threads), ``--threads 1``, ``--quick`` (two small shapes, short peak measurement: a smoke run),
``--json FILE``.

How it measures, and why:

1. The peak is measured in the same run by ``fma_peak.c``, compiled here with ``-O2 -march=native``:
   threads that only issue independent FMAs (AVX-512 and AVX2, whichever the CPU has; the best of
   a few measurements).  The peak used for "% of peak" is the best instruction set's figure for the
   same thread count.
2. Cuvil's GEMM is measured the way a user gets it: a one-node ONNX ``MatMul`` with both operands
   as inputs (so no packing is done ahead of time), compiled with ``cuvil.compile(...,
   target="native")`` (``num_threads=`` passed when ``cuvil.compile`` has it; otherwise Cuvil is
   single-threaded and every row says so).  The timed call includes Cuvil's per-call overhead
   (Python, input checks, allocating the output), which is small next to these sizes.
3. Every result is checked against NumPy in float64 first (relative L2 at most 1e-5), so a fast
   but wrong kernel prints no number.  The figure is the median of repeated calls.
4. For reference, ``torch.mm`` (PyTorch's BLAS) at the same thread count is timed too.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
SQUARE = [(n, n, n) for n in (256, 512, 1024, 2048)]
# (M, N, K) of a BERT-base layer over 128 tokens: projections, FFN up, FFN down
TRANSFORMER = [(128, 768, 768), (128, 3072, 768), (128, 768, 3072)]


def fma_peak(threads: int, seconds: float, repeats: int, folder: Path, cc: str) -> dict[str, float]:
    """GFLOP/s per instruction set for ``threads`` threads, from ``fma_peak.c``."""
    exe = folder / "fma_peak"
    if not exe.exists():
        subprocess.run([cc, "-O2", "-march=native", "-pthread", str(HERE / "fma_peak.c"), "-o", str(exe)],
                       check=True)
    out = subprocess.run([str(exe), str(threads), str(seconds), str(repeats)], check=True, capture_output=True,
                         text=True).stdout
    peaks: dict[str, float] = {}
    for line in out.splitlines():
        isa, _, gflops = line.split()
        peaks[isa] = float(gflops)
    return peaks


def matmul_onnx(m: int, n: int, k: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])], f"matmul_{m}x{n}x{k}",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


def threads_supported() -> bool:
    import importlib.util

    import cuvil

    if "num_threads" in inspect.signature(cuvil.compile).parameters:  # a Cuvil of keyword parameters
        return True
    if importlib.util.find_spec("cuvil.options") is None:
        return False
    from cuvil.options import KEYWORDS  # the options object's keyword spelling

    return "num_threads" in KEYWORDS


def time_call(call: Callable[[], Any], flops: float, budget_s: float) -> float:
    """Median GFLOP/s over repeated calls filling about ``budget_s`` (at least 3 calls)."""
    call()
    t0 = time.perf_counter()
    call()
    reps = max(3, int(budget_s / max(time.perf_counter() - t0, 1e-9)))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return flops / statistics.median(times) / 1e9


def bench_shape(m: int, n: int, k: int, threads: int, cache: Path, budget_s: float) -> dict[str, float]:
    import torch

    import cuvil
    from cuvil.metrics import relative_l2

    kwargs: dict[str, Any] = {"num_threads": threads} if threads_supported() else {}
    model = cuvil.compile(matmul_onnx(m, n, k), target="native", cache_dir=str(cache), **kwargs)
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    (c,) = model(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    err = relative_l2(c, want)
    if not err <= 1e-5:
        raise AssertionError(f"Cuvil MatMul {m}x{n}x{k}: relative L2 error {err:.2e} against NumPy float64")
    flops = 2.0 * m * n * k
    result = {"cuvil": time_call(lambda: model(a, b), flops, budget_s), "rel_l2": err}
    torch.set_num_threads(threads)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    result["torch.mm"] = time_call(lambda: torch.mm(ta, tb), flops, budget_s)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per shape and runtime")
    parser.add_argument("--peak-seconds", type=float, default=0.5, help="length of one FMA peak measurement")
    parser.add_argument("--quick", action="store_true", help="smoke run: two small shapes, short measurements")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    parser.add_argument("--cc", default="cc", help="C compiler for fma_peak.c")
    args = parser.parse_args(argv)
    shapes = SQUARE + TRANSFORMER
    repeats = 3
    if args.quick:
        shapes, args.seconds, args.peak_seconds, repeats = [(256, 256, 256), (128, 768, 768)], 0.05, 0.05, 1
    threads = [int(t) for t in args.threads.split(",")]
    supported = threads_supported()
    report: dict[str, Any] = {"cuvil_threads": supported, "rows": []}
    if not supported:
        print("note: cuvil.compile has no num_threads option: Cuvil runs single-threaded in every row")
    with tempfile.TemporaryDirectory(prefix="cuvil-gemm-") as tmp:
        folder = Path(tmp)
        for t in threads:
            peaks = fma_peak(t, args.peak_seconds, repeats, folder, args.cc)
            isa = max(peaks, key=lambda i: peaks[i])
            peak = peaks[isa]
            shown = ", ".join(f"{i} {g:.1f}" for i, g in peaks.items())
            print(f"\n{t} thread{'s' if t > 1 else ''}: measured FMA peak {peak:.1f} GFLOP/s ({shown})", flush=True)
            print("      M      N      K   cuvil GFLOP/s  % of peak   torch.mm GFLOP/s  % of peak")
            for m, n, k in shapes:
                r = bench_shape(m, n, k, t, folder / "cache", args.seconds)
                note = "" if supported or t == 1 else "  [Cuvil single-threaded]"
                print(f"  {m:5d}  {n:5d}  {k:5d}  {r['cuvil']:14.1f}  {100 * r['cuvil'] / peak:8.1f}%  "
                      f"{r['torch.mm']:17.1f}  {100 * r['torch.mm'] / peak:8.1f}%{note}", flush=True)
                report["rows"].append({"threads": t, "m": m, "n": n, "k": k, "peak_gflops": peak, "peak_isa": isa,
                                       "peaks": peaks, **r})
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

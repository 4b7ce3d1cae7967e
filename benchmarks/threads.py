"""Prints what threads inside kernels buy: single- vs multi-thread speed of ``cuvil_sgemm``, of a
ResNet-18-like convolution stack, and of ResNet-18 itself next to onnxruntime.

Usage: ``python benchmarks/threads.py [--threads 2] [--reps 20] [--no-resnet]``.

Every multi-thread result is checked bitwise against the single-thread one before it is timed.
Timings are medians; the ResNet-18 runs of Cuvil and onnxruntime (1 and N intra-op threads) are
interleaved in one process, so both see the same machine state.  The ResNet-18 part needs torch
and onnxruntime (it exports ``tests/support/zoo/networks.py``'s ResNet-18 as ``tests/support/exported.py`` does).
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

import cuvil
from cuvil.backends.c.toolchain import Compiler, build_library
from cuvil.metrics import relative_l2

HARNESS = r"""
#include <time.h>
#include "cuvil_gemm.h"
/* Seconds per product, the median of `reps` products on `threads` threads (after one that packs B),
 * in a call context of a model whose weights are B: B is packed once, as a model's weights are. */
static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
CUVIL_EXPORT double bench_sgemm(int64_t M, int64_t N, int64_t K, const float *A, const float *B, float *C, int reps,
                                int threads) {
    cuvil_shared s;
    double t[1000];
    if (reps < 1 || reps > 1000 || cuvil_shared_init(&s, (const unsigned char *)B, (size_t)(K * N * 4))) return -1;
    if (cuvil_shared_set_threads(&s, threads) != 0) return -1;
    cuvil_exec e;
    cuvil_exec_enter(&e, &s);
    int rc = cuvil_sgemm(M, N, K, 1.0f, A, K, 1, B, N, 1, 0.0f, C, N);
    for (int r = 0; r < reps && rc == 0; r++) {
        struct timespec t0, t1;
        timespec_get(&t0, TIME_UTC);
        rc = cuvil_sgemm(M, N, K, 1.0f, A, K, 1, B, N, 1, 0.0f, C, N);
        timespec_get(&t1, TIME_UTC);
        t[r] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    cuvil_exec_leave(&e);
    cuvil_shared_destroy(&s);
    qsort(t, (size_t)reps, sizeof t[0], cmp);
    return rc == 0 ? t[reps / 2] : -1;
}
"""

# (M, N, K): square, transformer-shaped (tokens x hidden), ResNet-18's conv GEMMs (channels x pixels),
# and an MLP layer at batch 1.
SIZES = [
    (512, 512, 512),
    (1024, 1024, 1024),
    (128, 512, 128),
    (128, 128, 512),
    (64, 3136, 576),
    (128, 784, 1152),
    (256, 196, 2304),
    (512, 49, 4608),
    (1, 1024, 784),
]


def interleaved(fns: list[Callable[[], object]], reps: int) -> list[float]:
    """Median seconds of each function, run in turn ``reps`` times (after a warm-up run of each)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def gemm_section(threads: int, reps: int, folder: Path) -> None:
    src, lib = folder / "bench_threads.c", folder / "bench_threads.so"
    src.write_text(HARNESS)
    build_library(Compiler(), src, lib, "native")
    dll = ctypes.CDLL(str(lib))
    i64, fp = ctypes.c_int64, ctypes.c_void_p
    dll.bench_sgemm.argtypes = [i64, i64, i64, fp, fp, fp, ctypes.c_int, ctypes.c_int]
    dll.bench_sgemm.restype = ctypes.c_double
    print(f"cuvil_sgemm, native, median of {reps} (B a constant weight: packed once)")
    print(f"{'M x N x K':>18} {'1 thread':>10} {f'{threads} threads':>11} {'speedup':>8}   GFLOP/s")
    rng = np.random.default_rng(0)
    for m, n, k in SIZES:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        outs = [np.zeros((m, n), np.float32) for _ in range(2)]
        sec = []
        for t, c in ((1, outs[0]), (threads, outs[1])):
            sec.append(dll.bench_sgemm(m, n, k, a.ctypes.data, b.ctypes.data, c.ctypes.data, reps, t))
            if sec[-1] < 0:
                raise RuntimeError("bench_sgemm failed")
        assert np.array_equal(outs[0], outs[1]), f"{m}x{n}x{k}: {threads} threads differ from 1"
        np.testing.assert_allclose(outs[0], a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(k))
        t1, tn = sec
        flop = 2.0 * m * n * k
        print(f"{f'{m} x {n} x {k}':>18} {t1 * 1e3:8.3f}ms {tn * 1e3:9.3f}ms {t1 / tn:7.2f}x   "
              f"{flop / t1 / 1e9:6.1f} -> {flop / tn / 1e9:6.1f}")


def conv_stack_onnx(batch: int) -> object:
    """ResNet-18's 3x3 convolution shapes (one of each stage, stride-2 entries included), with ReLUs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    chans = [(64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2), (512, 512, 1)]
    nodes, inits, prev = [], [], "x"
    for i, (cin, cout, s) in enumerate(chans):
        w = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2.0 / (9 * cin))).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], strides=[s, s]))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
        prev = f"r{i}"
    nodes[-1] = helper.make_node("Relu", [f"c{len(chans) - 1}"], ["y"])
    g = helper.make_graph(nodes, "conv_stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 64, 56, 56])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 512, 7, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_section(threads: int, reps: int, cache: str) -> None:
    print(f"\nResNet-18-like 3x3 conv stack (7 convs, 56x56 -> 7x7), native, median of {reps}")
    print(f"{'batch':>6} {'1 thread':>10} {f'{threads} threads':>11} {'speedup':>8}")
    for batch in (1, 4):
        model = conv_stack_onnx(batch)
        x = np.random.default_rng(1).standard_normal((batch, 64, 56, 56)).astype(np.float32)
        m1 = cuvil.compile(model, "native", cache_dir=cache, num_threads=1)
        mn = cuvil.compile(model, "native", cache_dir=cache, num_threads=threads)
        assert np.array_equal(m1(x)[0], mn(x)[0]), f"batch {batch}: {threads} threads differ from 1"
        t1, tn = interleaved([functools.partial(m1, x), functools.partial(mn, x)], reps)
        print(f"{batch:>6} {t1 * 1e3:8.2f}ms {tn * 1e3:9.2f}ms {t1 / tn:7.2f}x")


def resnet_section(threads: int, reps: int, cache: str, folder: Path) -> None:
    import onnxruntime as ort
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.support.exported import OPSET
    from tests.support.zoo.networks import CASES

    case = CASES["resnet18"]
    module = case.build()
    path = folder / "resnet18.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, case.inputs(1), str(path), dynamo=True, opset_version=OPSET)
    x = case.inputs(1)[0].numpy()
    runners: dict[str, Callable[[], object]] = {}
    outputs: dict[str, np.ndarray] = {}
    for t in sorted({1, threads}):
        m = cuvil.compile(str(path), "native", cache_dir=cache, num_threads=t)
        runners[f"cuvil {t}t"] = functools.partial(m, x)
        outputs[f"cuvil {t}t"] = m(x)[0]
        so = ort.SessionOptions()
        so.intra_op_num_threads = t
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        runners[f"ort {t}t"] = functools.partial(sess.run, None, {name: x})
        outputs[f"ort {t}t"] = sess.run(None, {name: x})[0]
    assert np.array_equal(outputs["cuvil 1t"], outputs[f"cuvil {threads}t"])
    ref = outputs["ort 1t"].astype(np.float64)
    err = relative_l2(outputs["cuvil 1t"], ref)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for fn in runners.values():
        fn()
    for _ in range(reps):  # interleaved: one run of each per round
        for k, fn in runners.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    print(f"\nResNet-18 (tests/support/zoo/networks.py), batch 1, interleaved, {reps} rounds; "
          f"cuvil vs onnxruntime relative L2 {err:.2e}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:>10}: median {med[k] * 1e3:7.2f} ms, p90 {np.percentile(v, 90) * 1e3:7.2f} ms")
    for t in sorted({1, threads}):
        print(f"cuvil/onnxruntime at {t} thread(s): {med[f'cuvil {t}t'] / med[f'ort {t}t']:.2f}")
    print(f"cuvil speedup {threads} threads vs 1: {med['cuvil 1t'] / med[f'cuvil {threads}t']:.2f}x; "
          f"onnxruntime: {med['ort 1t'] / med[f'ort {threads}t']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--no-resnet", action="store_true", help="skip ResNet-18 (needs torch and onnxruntime)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="cuvil-bench-threads-") as tmp:
        folder = Path(tmp)
        cache = str(folder / "cache")
        gemm_section(args.threads, args.reps, folder)
        conv_section(args.threads, args.reps, cache)
        if not args.no_resnet:
            resnet_section(args.threads, args.reps, cache, folder)


if __name__ == "__main__":
    main()

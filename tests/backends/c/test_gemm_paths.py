"""The GEMM's paths (cuvil_gemm.h): the small-M path against float64 products, fused epilogues
applied per tile bitwise equal to the unfused kernels, and the pool's blocking end-of-region
wait (cuvil_threads.h) driven from a small C program."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.metrics import relative_l2
from tests.backends.c.c_program import run_c_program

# float32 products of depth <= 1100 against float64: relative L2 well within this.
REL_L2 = 1e-5


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list[int]]], inits: dict[str, np.ndarray],
           outputs: list[tuple[str, list[int]]]) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "gemm_paths",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


# ---- the small-M path --------------------------------------------------------------------------

# (M, K, N): one row to MR and just past it (the blocked path), edges of the NR panels, K past one
# KC block, and a product large enough for the cost model to split it across two threads; a last
# panel of at most one vector of columns (N = 10, 33); one column panel over several row tiles
# (a batch-16 classifier, a partial last tile, the most rows that path takes, one row more).
SHAPES = [(1, 5, 10), (3, 300, 33), (6, 64, 100), (8, 257, 64), (9, 40, 70), (2, 1100, 1000),
          (16, 1024, 10), (20, 300, 16), (64, 100, 30), (65, 50, 10)]


@pytest.mark.parametrize("const_b", [True, False], ids=["packed-B", "row-major-B"])
def test_small_products_match_float64(tmp_path: Path, const_b: bool) -> None:
    """One model holding every shape's product (one build), run on 1 and 2 threads."""
    rng = np.random.default_rng(1)
    nodes, inputs, inits, outputs, feeds, wants = [], [], {}, [], [], []
    for i, (m, k, n) in enumerate(SHAPES):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        wants.append(a.astype(np.float64) @ b.astype(np.float64))
        nodes.append(helper.make_node("MatMul", [f"a{i}", f"b{i}"], [f"y{i}"]))
        inputs.append((f"a{i}", [m, k]))
        feeds.append(a)
        if const_b:
            inits[f"b{i}"] = b
        else:
            inputs.append((f"b{i}", [k, n]))
            feeds.append(b)
        outputs.append((f"y{i}", [m, n]))
    model = _model(nodes, inputs, inits, outputs)
    runs = []
    for threads in (1, 2):
        cm = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=threads)
        first, again = cm(*feeds), cm(*feeds)  # the second call reads B as packed by the first
        for shape, x, y in zip(SHAPES, first, again):
            assert np.array_equal(x, y), shape
        runs.append(first)
    for shape, got, got2, want in zip(SHAPES, runs[0], runs[1], wants):
        assert relative_l2(got, want) <= REL_L2, shape
        assert np.array_equal(got2, got), f"{shape}: num_threads=2 differs from num_threads=1"


def test_small_gemm_with_transposed_weights_alpha_and_bias(tmp_path: Path) -> None:
    """A batch-1 Linear layer as exported (Gemm, transB=1): B read through strides, packed once."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 300)).astype(np.float32)
    w = rng.standard_normal((130, 300)).astype(np.float32)
    c = rng.standard_normal(130).astype(np.float32)
    model = _model([helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)],
                   [("x", [1, 300])], {"w": w, "c": c}, [("y", [1, 130])])
    got = cuvil.compile(model, "native", cache_dir=str(tmp_path))(x)[0]
    want = 0.5 * (x.astype(np.float64) @ w.T.astype(np.float64)) + 2.0 * c
    assert relative_l2(got, want) <= REL_L2


# ---- epilogues in the tile ---------------------------------------------------------------------

EPILOGUES = ["bias-relu", "gemm-sigmoid", "residual-tanh", "scale-leaky-clip", "bias-gelu"]


def _epilogue_model(m: int, k: int, n: int, rng: np.random.Generator) -> onnx.ModelProto:
    """One product per EPILOGUES entry, each with its tail (one fuse-epilogue region each); inputs x, r."""
    # a weight per product: equal products would be merged by cse
    inits = {f"w{i}": rng.standard_normal((k, n)).astype(np.float32) / np.float32(np.sqrt(k)) for i in range(5)}
    inits |= {"wt": np.ascontiguousarray(inits.pop("w1").T), "bias": rng.standard_normal(n).astype(np.float32),
              "s": np.float32(0.7), "lo": np.float32(-0.5), "hi": np.float32(1.5)}
    mm = [helper.make_node("MatMul", ["x", f"w{i}"], [f"p{i}"]) for i in range(5)]
    nodes = [
        mm[0], helper.make_node("Add", ["p0", "bias"], ["q0"]), helper.make_node("Relu", ["q0"], ["y0"]),
        helper.make_node("Gemm", ["x", "wt", "bias"], ["q1"], transB=1), helper.make_node("Sigmoid", ["q1"], ["y1"]),
        mm[2], helper.make_node("Add", ["r", "p2"], ["q2"]), helper.make_node("Tanh", ["q2"], ["y2"]),
        mm[3], helper.make_node("Mul", ["p3", "s"], ["q3"]), helper.make_node("LeakyRelu", ["q3"], ["l3"], alpha=0.1),
        helper.make_node("Clip", ["l3", "lo", "hi"], ["y3"]),
        mm[4], helper.make_node("Add", ["p4", "bias"], ["q4"]), helper.make_node("Gelu", ["q4"], ["y4"]),
    ]
    return _model(nodes, [("x", [m, k]), ("r", [m, n])], inits, [(f"y{i}", [m, n]) for i in range(5)])


@pytest.mark.parametrize("m,k,n", [(1, 40, 70), (5, 300, 33), (37, 600, 100)], ids=["M1", "M5-K2blocks", "M37-blocked"])
def test_tile_epilogues_are_bitwise_the_unfused_kernels(tmp_path: Path, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m)
    model = _epilogue_model(m, k, n, rng)
    args = [rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)]
    unfused = cuvil.compile(model, "native", cache_dir=str(tmp_path), enable_fusion=False)(*args)
    wants = cuvil.compile(model, "ref")(*args)
    for name, got, want in zip(EPILOGUES, unfused, wants):
        assert relative_l2(got, want.astype(np.float64)) <= REL_L2, name
    for threads in (1, 2):
        fused = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=threads)
        build = fused.build_info
        assert build is not None
        assert build.warnings == "", build.warnings
        source = build.source.read_text()
        assert source.count("cuvil_sgemm_ep(") == len(EPILOGUES), "an epilogue is not in the tile"
        for name, got, want in zip(EPILOGUES, fused(*args), unfused):
            assert np.array_equal(got, want), f"{name} (M={m}, num_threads={threads}) differs from unfused"


def test_batched_matmul_epilogue_with_row_bias_and_residual(tmp_path: Path) -> None:
    """Products per batch index write inside one output: the epilogue finds each tile's place by offset."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 4, 2, 50)).astype(np.float32)
    b = rng.standard_normal((3, 1, 50, 24)).astype(np.float32)
    r = rng.standard_normal((3, 4, 2, 24)).astype(np.float32)
    bias = rng.standard_normal(24).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Add", ["p", "bias"], ["q"]),
                    helper.make_node("Add", ["q", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"])],
                   [("a", [3, 4, 2, 50]), ("b", [3, 1, 50, 24]), ("r", [3, 4, 2, 24])], {"bias": bias},
                   [("y", [3, 4, 2, 24])])
    fused = cuvil.compile(model, "native", cache_dir=str(tmp_path))
    assert fused.build_info is not None and "cuvil_sgemm_ep(" in fused.build_info.source.read_text()
    unfused = cuvil.compile(model, "native", cache_dir=str(tmp_path), enable_fusion=False)
    assert np.array_equal(fused(a, b, r)[0], unfused(a, b, r)[0])


# ---- the pool's end-of-region wait -------------------------------------------------------------

WAIT_TEST = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <time.h>
#include "cuvil_threads.h"

/* Task 0 runs on the caller (tid 0) and returns once a worker holds task 1, which sleeps 30 ms:
 * the caller must then wait for it, and should sleep, not spin, while it does. */
static atomic_int worker_in;
static void task(void *ctx, int64_t i, int tid) {
    int *hits = (int *)ctx;
    hits[i] += 1;
    if (tid != 0) {
        atomic_store(&worker_in, 1);
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
    } else {
        for (long n = 0; n < 2000000000L && !atomic_load(&worker_in); n++) CUVIL_PAUSE();
    }
}

static double cpu_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

int main(void) {
    static unsigned char weights[64];
    cuvil_shared s;
    if (cuvil_shared_init(&s, weights, sizeof weights) != 0 || cuvil_shared_set_threads(&s, 2) != 0) return 2;
    cuvil_exec e;
    cuvil_exec_enter(&e, &s);
    double worst = 0.0;
    for (int round = 0; round < 5; round++) {
        int hits[2] = {0, 0};
        atomic_store(&worker_in, 0);
        /* only a region whose task 1 the worker took tests the wait; retry the few the caller took whole */
        cuvil_parallel_for(2, task, hits);
        if (hits[0] != 1 || hits[1] != 1) return 3;
        if (!atomic_load(&worker_in)) continue;
        const double t0 = cpu_ms();
        atomic_store(&worker_in, 0);
        int again[2] = {0, 0};
        cuvil_parallel_for(2, task, again);
        const double used = cpu_ms() - t0;
        if (again[0] != 1 || again[1] != 1) return 4;
        if (atomic_load(&worker_in) && used > worst) worst = used;
    }
    cuvil_exec_leave(&e);
    cuvil_shared_destroy(&s);
    printf("%.3f\n", worst);
    return 0;
}
"""


def test_region_caller_sleeps_while_a_worker_finishes(tmp_path: Path) -> None:
    run = run_c_program(tmp_path, "wait", WAIT_TEST)
    assert run.returncode == 0, run.stderr
    # Waiting 30 ms for the worker costs the caller its brief spin, not 30 ms of CPU.
    assert float(run.stdout) < 10.0, f"the caller used {run.stdout.strip()} ms of CPU waiting"

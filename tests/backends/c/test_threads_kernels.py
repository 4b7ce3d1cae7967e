"""Threads inside kernels: bitwise the same results for any num_threads, the option's plumbing,
the pool itself (cuvil_threads.h) driven from a small C program, and no threads left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.backends.c.library import NativeModel, physical_cores
from cuvil.errors import CuvilError
from tests.backends.c.c_program import run_c_program

THREADS = (1, 2, 3)


def threaded_run(m: Any, x: np.ndarray) -> list[np.ndarray]:
    """One call of ``m(x)`` under the "always" split policy, which must run every region threaded
    (none declined, at least one run): the cost model's timing-dependent choices are off, so the
    split kernels are exercised whatever else the machine runs."""
    m.set_split_policy("always")
    before = m.thread_stats()
    out: list[np.ndarray] = m(x)
    step = m.thread_stats().since(before)
    assert step.calls == 1 and step.regions >= 1 and step.declined_regions == 0, step
    return out


# The reference interpreter is the oracle; float32 GEMMs of depth <= 600 stay well within this.
RTOL = 1e-4


def _native(m: cuvil.CompiledModel) -> NativeModel:
    native = m._executor.native  # type: ignore[attr-defined]
    assert isinstance(native, NativeModel)
    return native


def _model(nodes: list[onnx.NodeProto], x_shape: list[int | str], y_shape: list[int | str],
           inits: dict[str, np.ndarray], extra_inputs: list[onnx.ValueInfoProto] | None = None) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "threads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape), *(extra_inputs or [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def conv_stack() -> onnx.ModelProto:
    """3x3 (stride 1 and 2), 1x1, grouped and depthwise convolutions with biases, over a symbolic batch."""
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return np.asarray(rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:])), dtype=np.float32)

    inits: dict[str, np.ndarray] = {"w1": w(40, 16, 3, 3), "b1": w(40), "w2": w(48, 40, 3, 3), "w3": w(48, 1, 3, 3),
             "w4": w(64, 12, 1, 1), "b4": w(64), "w5": w(24, 64, 1, 1)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"], pads=[1, 1, 1, 1], group=48),  # depthwise
        helper.make_node("Conv", ["c3", "w4", "b4"], ["c4"], group=4),  # grouped 1x1
        helper.make_node("Conv", ["c4", "w5"], ["y"]),  # 1x1: the image is the GEMM operand
    ]
    return _model(nodes, ["n", 16, 30, 30], ["n", 24, 15, 15], inits)


def matmul_stack() -> onnx.ModelProto:
    """MatMul and Gemm (transposed, alpha, broadcast C) on odd sizes, plus a product of two inputs."""
    rng = np.random.default_rng(1)
    inits: dict[str, np.ndarray] = {"m1": rng.standard_normal((300, 520)).astype(np.float32) / 17,
             "m2": rng.standard_normal((77, 520)).astype(np.float32) / 23,
             "c": rng.standard_normal(77).astype(np.float32)}
    nodes = [
        helper.make_node("MatMul", ["x", "m1"], ["h"]),
        helper.make_node("Gemm", ["h", "m2", "c"], ["g"], transB=1, alpha=0.5),
        helper.make_node("MatMul", ["g", "z"], ["y"]),  # neither operand a constant
    ]
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [77, 90])
    return _model(nodes, ["n", 300], ["n", 90], inits, [z])


@pytest.mark.parametrize("batch", [1, 4])
def test_conv_results_are_bitwise_the_same_for_any_thread_count(tmp_path: Path, batch: int) -> None:
    model = conv_stack()
    x = np.random.default_rng(2).standard_normal((batch, 16, 30, 30)).astype(np.float32)
    want = cuvil.compile(model, "ref")(x)[0]
    got = [cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=n)(x)[0] for n in THREADS]
    np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    for n, y in zip(THREADS[1:], got[1:]):
        assert np.array_equal(y, got[0]), f"num_threads={n} differs from num_threads=1"


@pytest.mark.parametrize("batch", [1, 37])
def test_matmul_results_are_bitwise_the_same_for_any_thread_count(tmp_path: Path, batch: int) -> None:
    model = matmul_stack()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, 300)).astype(np.float32)
    z = rng.standard_normal((77, 90)).astype(np.float32)
    want = cuvil.compile(model, "ref")(x, z)[0]
    runs = []
    for n in THREADS:
        m = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=n)
        first, again = m(x, z)[0], m(x, z)[0]  # the second call reads the weights packed by the first
        assert np.array_equal(first, again)
        runs.append(first)
    np.testing.assert_allclose(runs[0], want, rtol=RTOL, atol=RTOL * float(np.abs(want).max()))
    for n, y in zip(THREADS[1:], runs[1:]):
        assert np.array_equal(y, runs[0]), f"num_threads={n} differs from num_threads=1"


def test_max_pool_results_are_the_same_for_any_thread_count(tmp_path: Path) -> None:
    """Threads take ranges of (plane, output row) rows: the generic 3x3 stride-2 padded pool and the
    2x2 stride-2 path, odd sizes and NaNs included, against the reference."""
    nodes = [helper.make_node("MaxPool", ["x"], ["p3"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["x"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p3"], ["f3"]), helper.make_node("Flatten", ["p2"], ["f2"]),
             helper.make_node("Concat", ["f3", "f2"], ["y"], axis=1)]
    model = _model(nodes, [2, 32, 61, 59], [2, 32 * (31 * 30 + 30 * 29)], {})
    x = np.random.default_rng(4).standard_normal((2, 32, 61, 59)).astype(np.float32)
    x[0, 3, 17, 20] = x[1, 30, 60, 58] = np.nan
    want = cuvil.compile(model, "ref")(x)[0]
    for n in THREADS:
        m = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=n)
        for got in [threaded_run(m, x)] if n > 1 else [m(x)]:
            np.testing.assert_array_equal(got[0], want, err_msg=f"num_threads={n}")


def test_elementwise_loops_split_across_threads_give_the_same_results(tmp_path: Path) -> None:
    """Flat elementwise loops (a fused chain with a scalar operand, a float16 op, a binary op of
    two intermediates) run as ranges on the threads when large; every element comes out the same."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]),
             helper.make_node("Mul", ["s", "k"], ["sk"]),
             helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Abs", ["h"], ["ha"]),
             helper.make_node("Cast", ["ha"], ["a"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["sk", "a"], ["y"])]
    shape = [3, 50, 61, 67]  # 613,050 elements: not a multiple of the ranges' granule
    model = _model(nodes, shape, shape, {"k": np.array(1.5, np.float32)})
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, np.inf, 0.0]
    want = cuvil.compile(model, "ref")(x)[0]
    runs = []
    for n in THREADS:
        m = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=n)
        runs.append((n, (threaded_run(m, x) if n > 1 else m(x))[0]))
    np.testing.assert_allclose(runs[0][1], want, rtol=1e-5, atol=0)
    for n, y in runs[1:]:
        np.testing.assert_array_equal(y, runs[0][1], err_msg=f"num_threads={n} differs from num_threads=1")


def test_view_copies_split_across_threads_give_the_same_results(tmp_path: Path) -> None:
    """Transposes (tiles of a unit-stride dim, in chunks of it; rows) and a stepped slice copy their
    blocks on the threads when large; every element comes out the same."""
    shape = [3, 7, 300, 401]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 2, 1]),  # innermost dim strided
             helper.make_node("Transpose", ["x"], ["u"], perm=[1, 0, 2, 3]),  # rows
             helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["s"])]
    inits = {"st": np.array([0, 1], np.int64), "en": np.array([300, 401], np.int64),
             "ax": np.array([2, 3], np.int64), "sp": np.array([1, 2], np.int64)}
    g = helper.make_graph(nodes, "views", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("t", "u", "s")],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    want = [x.transpose(0, 3, 2, 1), x.transpose(1, 0, 2, 3), x[:, :, :, 1::2]]
    for n in THREADS:
        m = cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=n)
        for got in [threaded_run(m, x)] if n > 1 else [m(x)]:
            for name, g_, w_ in zip("tus", got, want):
                np.testing.assert_array_equal(g_, w_, err_msg=f"{name}, num_threads={n}")


def test_num_threads_option(tmp_path: Path) -> None:
    model = matmul_stack()
    m = cuvil.compile(model, "native", cache_dir=str(tmp_path))
    assert _native(m).num_threads == physical_cores()
    lib = _native(m).lib
    assert lib.cuvil_get_num_threads(_native(m)._handle) == physical_cores()
    _native(m).set_num_threads(3)
    assert lib.cuvil_get_num_threads(_native(m)._handle) == 3
    for bad in (0, -2, 1.5, True):
        with pytest.raises(CuvilError, match="num_threads"):
            cuvil.compile(model, "native", cache_dir=str(tmp_path), num_threads=bad)  # type: ignore[arg-type]
    with pytest.raises(CuvilError, match="num_threads applies to the native C targets"):
        cuvil.compile(model, "ref", num_threads=2)
    assert cuvil.compile(model, "ref", num_threads=1) is not None


def test_split_policy_option(tmp_path: Path) -> None:
    """"auto" is the default; "always" survives a change of thread count and splits a region the cost
    model declines under "auto" (a ReLU over 4 KiB streams in well under the pool's cost)."""
    a = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    node = helper.make_node("Relu", ["x"], ["y"])
    m = cuvil.compile(_model([node], [4, 256], [4, 256], {}), "native", cache_dir=str(tmp_path), num_threads=2)
    assert _native(m).split_policy() == "auto"
    before = m.thread_stats()
    m(a)
    auto = m.thread_stats().since(before)
    assert auto.declined_regions >= 1 and auto.regions == 0, auto
    m.set_split_policy("always")
    _native(m).set_num_threads(3)
    assert _native(m).split_policy() == "always"
    before = m.thread_stats()
    np.testing.assert_array_equal(m(a)[0], np.maximum(a, 0))
    always = m.thread_stats().since(before)
    assert always.regions >= 1 and always.declined_regions == 0, always
    with pytest.raises(CuvilError, match="split policy must be one of auto, always"):
        m.set_split_policy("never")
    with pytest.raises(CuvilError, match="no split policy"):
        cuvil.compile(conv_stack(), "ref").set_split_policy("always")


def test_thread_stats_count_calls_regions_and_tasks(tmp_path: Path) -> None:
    x = np.random.default_rng(2).standard_normal((8, 16, 30, 30)).astype(np.float32)
    m = cuvil.compile(conv_stack(), "native", cache_dir=str(tmp_path), num_threads=2)
    start = m.thread_stats()
    assert start is not None and (start.calls, start.regions, start.tasks) == (0, 0, 0)
    for _ in range(4):
        m(x)
    st = m.thread_stats()
    assert st is not None and st.calls == 4
    assert st.regions > 0 and st.tasks >= 2 * st.regions  # a region has at least two tasks
    assert 0 <= st.worker_tasks <= st.tasks and st.worker_share is not None
    assert st.wait_s >= 0.0 and st.wait_estimate_s >= 0.0
    m(x)
    step = m.thread_stats().since(st)  # type: ignore[union-attr]
    assert step.calls == 1 and step.regions + step.declined_regions > 0 and step.wait_estimate_s >= 0.0

    one = cuvil.compile(conv_stack(), "native", cache_dir=str(tmp_path), num_threads=1)
    one(x)
    alone = one.thread_stats()
    assert alone is not None and (alone.calls, alone.regions, alone.tasks, alone.worker_share) == (0, 0, 0, None)
    assert cuvil.compile(conv_stack(), "ref").thread_stats() is None


def _threads_of_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_workers_start_with_the_model_and_end_with_it(tmp_path: Path) -> None:
    before = _threads_of_this_process()
    m = cuvil.compile(conv_stack(), "native", cache_dir=str(tmp_path), num_threads=4)
    assert _threads_of_this_process() == before + 3
    names = {Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")}
    assert {"cuvil-worker-1", "cuvil-worker-2", "cuvil-worker-3"} <= names  # named for top and debuggers
    _native(m).set_num_threads(1)
    assert _threads_of_this_process() == before
    _native(m).set_num_threads(2)
    assert _threads_of_this_process() == before + 1
    _native(m).close()
    assert _threads_of_this_process() == before


POOL_TEST = r"""
#include <stdio.h>
#include "cuvil_threads.h"

typedef struct { int *hits; int *nested; int64_t ntasks; int threads; int bad_tid; } job;

static void inner(void *ctx, int64_t i, int tid) { (void)tid; ((int *)ctx)[i] += 1; }

static void task(void *ctx, int64_t i, int tid) {
    job *j = (job *)ctx;
    if (tid < 0 || tid >= j->threads) j->bad_tid = 1;
    j->hits[i] += 1;
    /* a region inside a task of a parallel region runs on the task's thread */
    if (j->ntasks > 1 && cuvil_num_threads_now() != 1) j->bad_tid = 1;
    int local[3] = {0, 0, 0};
    cuvil_parallel_for(3, inner, local);
    j->nested[i] = local[0] + local[1] + local[2];
}

int main(void) {
    static unsigned char weights[64];
    cuvil_shared s;
    if (cuvil_shared_init(&s, weights, sizeof weights) != 0 || cuvil_shared_set_threads(&s, 3) != 0) return 2;
    cuvil_exec e;
    cuvil_exec_enter(&e, &s);
    if (cuvil_num_threads_now() != 3) return 3;
    for (int64_t n = 0; n < 2000; n++) {
        const int64_t ntasks = (n * 7919) % 23;
        int hits[23] = {0}, nested[23] = {0};
        job j = {hits, nested, ntasks, 3, 0};
        cuvil_parallel_for(ntasks, task, &j);
        for (int64_t i = 0; i < 23; i++)
            if (hits[i] != (i < ntasks) || nested[i] != 3 * (i < ntasks)) return 4;
        if (j.bad_tid) return 5;
    }
    /* a second context on the same model, while the first holds the pool, runs on its own thread */
    cuvil_exec other;
    cuvil_exec_enter(&other, &s);
    if (cuvil_num_threads_now() != 1) return 6;
    cuvil_exec_leave(&other);
    cuvil_exec_leave(&e);
    cuvil_shared_destroy(&s);
    puts("ok");
    return 0;
}
"""


def test_pool_runs_every_task_once_and_does_not_nest(tmp_path: Path) -> None:
    run = run_c_program(tmp_path, "pool", POOL_TEST)
    assert (run.returncode, run.stdout.strip()) == (0, "ok")


PLACEMENT_TEST = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include "cuvil_threads.h"

typedef struct { int caller_cpu; int worker_tasks; int worker_on_caller; } job;

static void task(void *ctx, int64_t i, int tid) {
    (void)i;
    job *j = (job *)ctx;
    const double t0 = cuvil_now_ns();
    while (cuvil_now_ns() - t0 < 20000.0) {
    }
    if (tid != 0) {
        j->worker_tasks++;
        j->worker_on_caller += sched_getcpu() == j->caller_cpu;
    }
}

int main(void) {
    cuvil_shared s;
    if (cuvil_shared_init(&s, NULL, 0) != 0 || cuvil_shared_set_threads(&s, 2) != 0) return 3;
    cpu_set_t one; /* the caller stays on its CPU (the worker, started before, may run on any) */
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) != 0) return 2;
    int joined = 0, later = 0, tasks = 0, on_caller = 0;
    for (int round = 0; round < 6; round++) {
        const struct timespec idle = {0, 150000000}; /* long enough for the workers to sleep */
        nanosleep(&idle, NULL);
        for (int call = 0; call < 4; call++) {
            cuvil_exec e;
            cuvil_exec_enter(&e, &s);
            job j = {sched_getcpu(), 0, 0};
            for (int r = 0; r < 10; r++) cuvil_parallel_for(8, task, &j);
            cuvil_exec_leave(&e);
            if (call > 0) {
                later++;
                joined += j.worker_tasks > 0;
            }
            tasks += j.worker_tasks;
            on_caller += j.worker_on_caller;
        }
    }
    cuvil_shared_destroy(&s);
    printf("%d %d %d %d\n", joined, later, tasks, on_caller);
    return 0;
}
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs")
@pytest.mark.serial
def test_workers_keep_off_the_callers_cpu_after_idling(tmp_path: Path) -> None:
    """A worker woken after the pool idled must not share the caller's CPU: where the kernel places
    it there (as it does on virtual machines whose other vCPU idled), the call runs on one core."""
    run = run_c_program(tmp_path, "placement", PLACEMENT_TEST)
    assert run.returncode == 0, run.stderr
    joined, later, tasks, on_caller = map(int, run.stdout.split())
    # the calls after the first of each round find the worker ready, and it takes a fair share of
    # the tasks (it takes ~45%; sharing the caller's CPU it took ~15%), none on the caller's CPU
    assert joined >= later * 3 // 4, run.stdout
    assert tasks >= 6 * 4 * 10 * 8 // 4, run.stdout
    assert on_caller <= tasks // 20, run.stdout

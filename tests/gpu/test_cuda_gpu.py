"""The CUDA target on a real GPU (marked ``gpu``: skipped without one): every kernel family and
the tiny CNN against the reference, bitwise agreement of several host threads calling one model,
and the latency of a whole model printed beside the emulated build's check.  Run them all with
tests/gpu/run_on_device.sh."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

import cuvil
from tests.cuda.support import GRAPHS, graph
from tests.cuda.test_cuda_sim import EXAMPLES, assert_matches_ref, random_inputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("target", ["cuda", "cuda:sm_90"])
@pytest.mark.parametrize("family", sorted(GRAPHS))
def test_kernel_family_matches_reference_on_the_gpu(family: str, target: str, tmp_path: Path) -> None:
    g = graph(family)
    m = cuvil.compile(g, target=target, cache_dir=str(tmp_path))
    for n in (1, 3, 17, 64):
        assert_matches_ref(m, g, random_inputs(m, n, seed=n))


def test_tiny_cnn_matches_reference_on_the_gpu(tmp_path: Path) -> None:
    path = EXAMPLES / "tiny_cnn.onnx"
    m = cuvil.compile(path, target="cuda", cache_dir=str(tmp_path))
    for n in (1, 8):
        assert_matches_ref(m, path, random_inputs(m, n, seed=n))


def test_threads_calling_one_model_agree_bitwise(tmp_path: Path) -> None:
    path = EXAMPLES / "tiny_cnn.onnx"
    m = cuvil.compile(path, target="cuda", cache_dir=str(tmp_path))
    xs = [random_inputs(m, 4, seed=s) for s in range(4)]
    alone = [np.asarray(m(*x)) for x in xs]
    got: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        for _ in range(5):
            got[i] = np.asarray(m(*xs[i]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        np.testing.assert_array_equal(got[i], alone[i])


def test_latency_of_the_tiny_cnn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "tiny_cnn.onnx"
    m = cuvil.compile(path, target="cuda", cache_dir=str(tmp_path))
    for batch in (1, 16):
        x = random_inputs(m, batch)
        m(*x)
        times = []
        for _ in range(50):
            t0 = time.perf_counter()
            m(*x)
            times.append(time.perf_counter() - t0)
        with capsys.disabled():
            print(f"\ntiny_cnn cuda batch {batch}: median {np.median(times) * 1e3:.3f} ms, "
                  f"p90 {np.percentile(times, 90) * 1e3:.3f} ms (host copies included)")
        assert np.median(times) > 0

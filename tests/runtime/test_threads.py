"""One compiled model called from many threads at once gives, call for call, the serial results."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil

THREADS = 8
CALLS = 50


def mixed_model() -> onnx.ModelProto:
    """conv -> relu -> matmul -> + bias -> softmax, and a second output, with a symbolic batch."""
    rng = np.random.default_rng(0)
    init = {
        "w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32),
        "cb": rng.standard_normal(8).astype(np.float32),
        "m": rng.standard_normal((6, 5)).astype(np.float32) / 4,
        "b": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MatMul", ["r", "m"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["probs"], axis=-1),
        helper.make_node("Sub", ["x", "x2"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["sq"]),
    ]
    g = helper.make_graph(
        nodes, "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 6, 6]),
         helper.make_tensor_value_info("x2", TensorProto.FLOAT, ["batch", 3, 6, 6])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 8, 6, 5]),
         helper.make_tensor_value_info("sq", TensorProto.FLOAT, ["batch", 3, 6, 6])],
        [onnx.numpy_helper.from_array(v, k) for k, v in init.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_threads_get_bitwise_the_serial_results(tmp_path_factory: pytest.TempPathFactory) -> None:
    m = cuvil.compile(mixed_model(), "native", cache_dir=str(tmp_path_factory.mktemp("cache")))
    rng = np.random.default_rng(1)
    inputs = []
    for i in range(THREADS * CALLS):
        batch = 1 + i % 3  # different shapes too: every call allocates its own memory
        inputs.append([rng.standard_normal((batch, 3, 6, 6)).astype(np.float32) for _ in range(2)])
    serial = [m(*args) for args in inputs]
    ref = cuvil.compile(mixed_model(), "ref")
    for args, outs in zip(inputs[:3], serial[:3]):  # the serial results are right, too
        for got, want in zip(outs, ref(*args)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    results: list[list[np.ndarray] | None] = [None] * len(inputs)
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def work(t: int) -> None:
        try:
            start.wait()
            for j in range(CALLS):
                i = j * THREADS + t  # threads interleave over the inputs
                results[i] = m(*inputs[i])
        except BaseException as exc:  # reported below, with the thread's traceback lost otherwise
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for i, (got, want) in enumerate(zip(results, serial)):
        assert got is not None
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.tobytes() == w.tobytes(), f"call {i}: differs from the serial result"


def test_run_errors_in_threads_stay_in_their_call(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Calls the library's own input checks reject fail alone, with their own message; the others succeed."""
    from cuvil.backends.c.library import RunError

    m = cuvil.compile(mixed_model(), "native", cache_dir=str(tmp_path_factory.mktemp("cache")))
    executor = m._executor  # past the Python guards, so the checks in C are the ones that fail
    good = [np.ones((2, 3, 6, 6), np.float32)] * 2
    bad = [good[0], np.ones((3, 3, 6, 6), np.float32)]
    want = [o.tobytes() for o in m(*good)]
    outcomes: list[str] = [""] * (THREADS * 10)

    def work(t: int) -> None:
        for j in range(10):
            i = t * 10 + j
            try:
                if i % 2:
                    executor.run(bad, {})
                    outcomes[i] = "no error"
                else:
                    outs = executor.run(good, {})
                    outcomes[i] = "ok" if [o.tobytes() for o in outs] == want else "wrong result"
            except RunError as exc:
                ok = str(exc) == "input x2: dim 0 is batch=3, but an earlier input gave 2"
                outcomes[i] = "run error" if ok else str(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert outcomes == ["ok", "run error"] * (THREADS * 5)

"""Runtime checks: layerwise, latency, batch-scaling, concurrency (cuvil/verify/checks/).

Each check passes on correct models (the bundled tiny CNN, a small ONNX MLP with a
symbolic batch) and fails, pointing at the right place, on a planted fault: a kernel
emitter monkeypatched to corrupt one node's output, one that leaks a later sample into
the first, and a custom op whose C kernel keeps its work in a static buffer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
import cuvil.verify.checks  # registers the checks
from cuvil import Arg, OpSchema
from cuvil.backends.c.kernel import _KERNELS, Kernel, KernelCtx
from cuvil.verify.base import Status
from tests.support.paths import REPO
from tests.verify.models import context, run

TINY_CNN = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"
Planter = Callable[[str, Callable[[KernelCtx], str]], None]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


def mlp(batch_max: int | None = None) -> onnx.ModelProto:
    """x[batch, 16] -> Gemm -> Relu -> Gemm -> y[batch, 4], symbolic batch."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32), "w2")
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("Gemm", ["a", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def corrupt_kernel(monkeypatch: pytest.MonkeyPatch) -> Planter:
    """Replace one op's C emitter by the real one followed by a line of C that breaks its output."""

    def plant(op: str, extra: Callable[[KernelCtx], str]) -> None:
        real = _KERNELS[op]

        def emit(k: KernelCtx) -> None:
            real.emit(k)
            k.w.line(extra(k))

        monkeypatch.setitem(_KERNELS, op, Kernel(emit, real.computes_shape))

    return plant


# layerwise ---------------------------------------------------------------------------------------------
def test_layerwise_passes_on_the_tiny_cnn(tmp_path: Path, cache: str) -> None:
    res = run("layerwise", context(onnx.load(TINY_CNN), ["ref", "native"], tmp_path, cache))
    for target in ("ref", "native"):
        r = res[target]
        assert r.status is Status.PASS, r.summary
        assert r.details["oracle"] == "onnxruntime" and r.details["tap_changed_outputs"] == []
        series = r.details["series"]
        assert [e["layer"] for e in series] == list(range(len(series))) and series[-1]["value"] == "probs"
        assert all(e["rel_l2"] < 1e-5 for e in series)
    # taps sit at fusion-group boundaries: native fuses conv1+bn1+relu1, so r1 is a layer, c1 and b1 are not
    native = {e["value"]: e for e in res["native"].details["series"]}
    assert "r1" in native and "c1" not in native and native["r1"]["cuvil_node"] == "conv1"
    assert native["r1"]["source_node"] == "relu1"
    assert {"c1", "b1", "r1"} <= {e["value"] for e in res["ref"].details["series"]}


def test_layerwise_names_the_first_wrong_layer(tmp_path: Path, cache: str, corrupt_kernel: Planter) -> None:
    corrupt_kernel("max_pool", lambda k: f"{k.out().ptr}[3] += 1.0f;")
    r = run("layerwise", context(onnx.load(TINY_CNN), ["native"], tmp_path, cache))["native"]
    assert r.status is Status.FAIL
    assert r.where["layer"] == "p1" and r.where["node"] == "pool1" and r.where["source_node"] == "pool1"
    path, line = r.where["code"].rsplit(":", 1)
    assert "node 'pool1'" in Path(path).read_text().splitlines()[int(line) - 1]
    series = r.details["series"]
    assert series[0]["value"] == "r1" and series[0]["rel_l2"] < 1e-5  # the layer before is fine
    assert {"p1.compiled", "p1.oracle"} <= set(r.tensors)


def test_layerwise_on_a_cuvil_graph_uses_the_float64_reference(tmp_path: Path, cache: str) -> None:
    graph = cuvil.compile(mlp(), target="ref").graph
    r = run("layerwise", context(graph, ["native"], tmp_path, cache, kind="graph"))["native"]
    assert r.status is Status.PASS and r.details["oracle"].startswith("reference interpreter")
    assert [e["value"] for e in r.details["series"]][-1] == "y"


def test_layerwise_threshold_is_configurable(tmp_path: Path, cache: str) -> None:
    r = run("layerwise", context(mlp(), ["native"], tmp_path, cache), threshold=0.0)["native"]
    errs = [e["rel_l2"] for e in r.details["series"]]
    assert (r.status is Status.FAIL) == any(e > 0 for e in errs)


# latency -------------------------------------------------------------------------------------------------
def test_latency_breakdown_and_chrome_trace(tmp_path: Path, cache: str) -> None:
    trace = tmp_path / "trace.json"
    res = run("latency", context(onnx.load(TINY_CNN), ["ref", "native"], tmp_path, cache), trace=str(trace),
              min_runs=10, min_seconds=0.05, max_spread=1e9)
    r = res["native"]
    assert r.status is Status.PASS, r.summary
    f = r.figures
    assert f["runs"] >= 10 and 0 < f["median_ms"] <= f["p90_ms"] <= f["p99_ms"]
    names = [b["name"] for b in r.details["breakdown"]]
    graph = cuvil.compile(str(TINY_CNN), target="native", cache_dir=cache).graph
    assert graph is not None
    kernels = [f"{n.name} ({n.op})" for n in graph.nodes if n.op != "constant"]
    assert names == ["validate", "bind inputs", *kernels, "copy-out", "call overhead"]
    assert f["kernels_median_ms"] > 0
    assert res["ref"].status is Status.PASS and "breakdown" not in res["ref"].details
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in spans] == names
    assert all(b["ts"] + b["dur"] <= a["ts"] + 1e-6 for a, b in zip(spans[1:], spans))  # ordered, not overlapping
    assert any(e["ph"] == "M" and e["args"]["name"] == "latency [native]" for e in events)


def test_latency_budget_and_spread(tmp_path: Path, cache: str) -> None:
    ctx = context(onnx.load(TINY_CNN), ["native"], tmp_path, cache)
    r = run("latency", ctx, min_runs=5, min_seconds=0.0, budget_ms=1e-6)["native"]
    assert r.status is Status.FAIL and "budget" in r.summary and r.where["node"].endswith(")")
    r = run("latency", ctx, min_runs=5, min_seconds=0.0, max_spread=-1.0)["native"]
    assert r.status is Status.WARN and "too wide" in r.summary


# batch-scaling ---------------------------------------------------------------------------------------------
def test_batch_scaling_sweeps_to_the_memory_limit(tmp_path: Path, cache: str) -> None:
    # unfused (ref), batch b holds x (64b bytes), h and a (128b each) at once, then a and y (16b), and
    # 2560 bytes of weights: the limit below fits batch 40 and no more
    limit = 2560 + 64 * 40 + 256 * 40
    r = run("batch-scaling", context(mlp(), ["ref"], tmp_path, cache), memory_limit=limit, min_runs=2,
            min_seconds=0.0)["ref"]
    assert r.status is Status.PASS, r.summary
    sizes = [row["batch"] for row in r.details["series"]]
    assert sizes[:6] == [1, 2, 4, 8, 16, 32] and sizes[-1] == 40 and r.details["stopped_by"] == "memory limit"
    row = r.details["series"][-1]
    assert row["input_bytes"] == 64 * 40 and row["weights_bytes"] == 2560
    assert row["peak_live_bytes"] + row["input_bytes"] + row["weights_bytes"] <= limit
    assert row["allocated_bytes"] >= row["peak_live_bytes"] > 0 and row["fragmentation"] is None
    assert r.figures["knee_batch"] in sizes and all(x["batch_vs_single_rel_l2"] < 1e-6 for x in r.details["series"])


def test_batch_scaling_catches_samples_leaking_into_each_other(tmp_path: Path, cache: str,
                                                               corrupt_kernel: Planter) -> None:
    corrupt_kernel("gemm", lambda k: f"{k.out().ptr}[0] += {k.inp(0).ptr}[{k.inp(0).numel()} - 1];")
    r = run("batch-scaling", context(mlp(), ["native"], tmp_path, cache), max_batch=4, min_runs=2,
            min_seconds=0.0)["native"]
    assert r.status is Status.FAIL and r.where == {"symbol": "batch", "batch": "2", "output": "y"}


def test_batch_scaling_skips_a_fixed_batch(tmp_path: Path, cache: str) -> None:
    graph = cuvil.compile(mlp(), target="ref", dims={"batch": 3}).graph
    r = run("batch-scaling", context(graph, ["ref"], tmp_path, cache, kind="graph"), max_batch=2)["ref"]
    assert r.status is Status.SKIP and r.where == {"symbol": "batch"} and "fixed at 3" in r.summary


def nonzero_model() -> onnx.ModelProto:
    """x[batch, 4] -> Relu -> y, and NonZero(y) -> idx[2, ?]: an output whose extent is data-dependent."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="act"),
             helper.make_node("NonZero", ["y"], ["idx"], name="where_positive")]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                               helper.make_tensor_value_info("idx", TensorProto.INT64, [2, "n"])], [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", ["ref", "native"])
def test_batch_scaling_with_a_data_dependent_dim(target: str, tmp_path: Path, cache: str) -> None:
    r = run("batch-scaling", context(nonzero_model(), [target], tmp_path, cache), max_batch=4, min_runs=2,
            min_seconds=0.0)[target]
    assert r.status is Status.PASS, r.summary
    assert [row["batch"] for row in r.details["series"]] == [1, 2, 4]
    assert "idx" in r.details["runtime_sized"]["values"] and "sized only at run time" in r.summary
    row = r.details["series"][-1]
    assert row["input_bytes"] == 4 * 4 * 4 and row["peak_live_bytes"] >= 4 * 4 * 4  # y is still counted


# concurrency -----------------------------------------------------------------------------------------------
def test_concurrency_threads_and_processes(tmp_path: Path, cache: str) -> None:
    r = run("concurrency", context(onnx.load(TINY_CNN), ["ref", "native"], tmp_path, cache), instances=3,
            repeats=2)
    assert r["native"].status is Status.PASS and r["native"].details["modes"] == ["threads", "processes"]
    fp = r["native"].details["fingerprint_before"]
    assert {"weights_file", "weights_loaded", "canary_outputs"} <= set(fp) and fp == r["native"].details["fingerprint_after"]
    assert r["ref"].status is Status.PASS and r["ref"].details["modes"] == ["threads"]


STATIC_SCRATCH_C = r"""
static float scratch[1 << 16];
int cuviltest_racy(const cuvil_tensor *inputs, int n_inputs, cuvil_tensor *outputs, int n_outputs,
                   const cuvil_custom_attr *attrs) {
    (void)n_inputs; (void)n_outputs; (void)attrs;
    const float *x = (const float *)inputs[0].data;
    float *out = (float *)outputs[0].data;
    int64_t n = cuvil_numel(inputs[0].shape, inputs[0].rank);
    if (n > (1 << 16)) return 1;
    for (int64_t i = 0; i < n; i++) scratch[i] = 2.0f * x[i];
    for (volatile int64_t k = 0; k < 20000000; k++) { }
    for (int64_t i = 0; i < n; i++) out[i] = scratch[i];
    return 0;
}
"""


@pytest.fixture
def racy_op() -> Iterator[None]:
    schema = OpSchema(inputs=[Arg("x", 2)], outputs=[Arg("out", 2)], shape=lambda x: [x])
    with cuvil.register_op("cuviltest::racy", schema=schema, reference=lambda x: (2 * x).astype(np.float32),
                           c_source=STATIC_SCRATCH_C):
        yield


def test_concurrency_catches_a_thread_unsafe_kernel(racy_op: None, tmp_path: Path, cache: str) -> None:
    nodes = [helper.make_node("racy", ["x"], ["y"], domain="cuviltest", name="racy")]
    graph = helper.make_graph(nodes, "racy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("cuviltest", 1)])
    r = run("concurrency", context(model, ["native"], tmp_path, cache), instances=4, repeats=8,
            processes=False)["native"]
    assert r.status is Status.FAIL and r.where["mode"] == "threads" and r.where["output"] == "y"
    assert r.figures["mismatches"] > 0

"""The fault-injection suite: every planted fault of cuvil/faults.py is caught by the check meant for it.

For each fault: a small model the fault applies to, built here; with the fault planted the check
fails and its ``where`` points at the pass, layer, node or symbol the bug lives in; without it the
same check on the same model passes.  The table below is checked against ``cuvil.faults.FAULTS``,
so a new fault cannot be added without a test here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import cuvil
import cuvil.faults
import cuvil.verify.checks  # registers the checks
from cuvil.api import import_model
from cuvil.verify.base import CheckResult, Status, get_check
from cuvil.verify.context import ModelSource, VerifyContext
from tests.verify.models import f32, if_on_sum, onnx_model, residual_softmax


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cuvil-cache"))


def _weights(name: str, *shape: int, seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)


def two_convs() -> onnx.ModelProto:
    """x[1,3,17,17] -> conv1 (3x3, stride 2, pad 1) -> relu -> conv2 (3x3, pad 1) -> y."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["a1"], name="act1"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    inits = [_weights("w1", 8, 3, 3, 3, seed=1), _weights("b1", 8, seed=2), _weights("w2", 4, 8, 3, 3, seed=3),
             _weights("b2", 4, seed=4)]
    return onnx_model(nodes, [f32("x", [1, 3, 17, 17])], [f32("y", [1, 4, 9, 9])], inits)


def conv_bn() -> onnx.ModelProto:
    """x -> conv -> BatchNormalization (non-trivial statistics, epsilon 1e-3) -> relu -> y."""
    rng = np.random.default_rng(5)
    stats = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("scale", rng.uniform(0.5, 1.5, 8)), ("shift", rng.normal(0, 0.1, 8)), ("mean", rng.normal(0, 0.1, 8)),
        ("var", rng.uniform(1e-3, 4e-3, 8)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"], name="bn",
                              epsilon=1e-3),
             helper.make_node("Relu", ["n"], ["y"], name="act")]
    return onnx_model(nodes, [f32("x", [1, 3, 8, 8])], [f32("y", [1, 8, 8, 8])], [_weights("w", 8, 3, 3, 3, seed=6),
                                                                                  *stats])


def channel_softmax() -> onnx.ModelProto:
    """y = softmax over the 64 channels of x[1, 64, 128, 128]: per-pixel maxima and sums kept in scratch.

    Large enough (about 10 ms a call) that concurrent calls overlap inside the kernel nearly
    every time, so a scratch buffer they share corrupts some of the 12 concurrent runs."""
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="pixels", axis=1)]
    return onnx_model(nodes, [f32("x", [1, 64, 128, 128])], [f32("y", [1, 64, 128, 128])], [])


def bounded_mlp() -> cuvil.ir.graph.Graph:
    """x[batch, 16] -> Gemm -> Relu -> Gemm -> y[batch, 4] with batch in 1..8 (a Cuvil graph)."""
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["a"], name="act"),
             helper.make_node("Gemm", ["a", "w2"], ["y"], name="fc2")]
    proto = onnx_model(nodes, [f32("x", ["batch", 16])], [f32("y", ["batch", 4])],
                   [_weights("w1", 16, 32, seed=7), _weights("w2", 32, 4, seed=8)])
    return import_model(proto, {"batch": (1, 8)})


def _ctx(model: object, tmp_path: Path, cache: str) -> VerifyContext:
    kind = "graph" if isinstance(model, cuvil.ir.graph.Graph) else "onnx"
    return VerifyContext(ModelSource(kind, model), ["native"], work_dir=tmp_path, cache_dir=cache)


def _run(check: str, model: Callable[[], object], tmp_path: Path, cache: str, fault: str | None,
         **options: object) -> CheckResult:
    """The check's result on native for a fresh context, with ``fault`` planted throughout (compile and run)."""
    ctx = _ctx(model(), tmp_path / (fault or "clean"), cache)
    if fault is None:
        results = get_check(check)(options).run(ctx)
    else:
        with cuvil.faults.plant(fault):
            results = get_check(check)(options).run(ctx)
    by_target = {r.target: r for r in results}
    return by_target.get("native", results[0])


def _layer_of_conv1(r: CheckResult) -> None:
    # the first conv's fusion group (conv1 + its bias and relu) is the first bad layer, with its C line
    assert r.where["source_node"] in ("conv1", "act1") and r.where["layer"] in ("c1", "a1"), r.where
    assert r.where["node"] in ("conv1", "act1") and r.where["code"].rpartition(":")[0].endswith("model.c"), r.where


def _pass_fold_batchnorm(r: CheckResult) -> None:
    assert r.where["pass"] == "fold-batchnorm", r.where


def _arena(r: CheckResult) -> None:
    # a planned build disagrees with an unplanned (or poisoned) one, at a layer of the model
    assert "planned" in r.where["pair"] and r.where["output"] == "y", r.where
    assert r.where["node"] in ("exp", "sm1", "scale", "sm2", "residual"), r.where


def _softmax_node(r: CheckResult) -> None:
    assert r.where["output"] == "y" and r.where["mode"] == "threads", r.where
    assert r.where["node"] == "pixels" and r.where["layer"] == "y", r.where


def _if_node(r: CheckResult) -> None:
    assert r.where["node"] == "big" and r.where["branch"] == "then", r.where


def _batch_symbol(r: CheckResult) -> None:
    assert r.where["symbol"] == "batch" and r.where["value"] == "9", r.where


#: fault -> (check, model, options, what ``where`` must say)
CASES: dict[str, tuple[str, Callable[[], object], dict[str, object], Callable[[CheckResult], None]]] = {
    "conv-stride": ("layerwise", two_convs, {}, _layer_of_conv1),
    "conv-pad": ("layerwise", two_convs, {}, _layer_of_conv1),
    "bn-epsilon": ("passes", conv_bn, {}, _pass_fold_batchnorm),
    "arena-overlap": ("fusion-memory", residual_softmax, {}, _arena),
    "stale-read": ("fusion-memory", residual_softmax, {}, _arena),
    "shared-scratch": ("concurrency", channel_softmax, {"processes": False}, _softmax_node),
    "if-branch": ("control-flow", if_on_sum, {}, _if_node),
    "drop-guard": ("dynamic-shapes", bounded_mlp, {}, _batch_symbol),
}


def test_every_fault_has_a_case() -> None:
    # the call-path faults end the process: the fleet's job isolation catches them (test_call_path_faults below,
    # and tests/verify/fleet/test_sweep.py); the CUDA kernels' faults are caught by the emulated tests
    # (tests/cuda/test_cuda_faults.py)
    assert set(CASES) == set(cuvil.faults.FAULTS) - set(cuvil.faults.CALL_FAULTS) - set(cuvil.faults.CUDA_FAULTS)


_CALL = """
import sys, numpy as np, cuvil
m = cuvil.compile(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3], faults={sys.argv[4]})
if sys.argv[5:] == ["compile-only"]:
    sys.exit(0)
if sys.argv[5:]:
    m = cuvil.load(m.save(sys.argv[5]))  # the artifact keeps the bug
m(np.ones((4, 64), np.float32))
print("ran")
"""


@pytest.mark.slow
def test_call_path_faults_crash_or_hang_a_c_build_only(tmp_path: Path, cache: str) -> None:
    import os
    import signal
    import subprocess
    import sys

    from tests.support.paths import REPO

    model = tmp_path / "m.onnx"
    onnx.save(residual_softmax(), model)

    def call(target: str, fault: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _CALL, str(model), target, cache, fault, *extra],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(REPO)})

    crashed = call("native", "native-crash")
    assert crashed.returncode == -signal.SIGSEGV, crashed.stderr[-2000:]
    assert call("native", "native-crash", str(tmp_path / "artifact")).returncode == -signal.SIGSEGV
    assert call("ref", "native-crash").stdout.strip() == "ran"  # the reference interpreter has no C build
    assert call("native", "native-hang", "compile-only").returncode == 0  # the build: the next call only runs it
    with pytest.raises(subprocess.TimeoutExpired):
        call("native", "native-hang", timeout=5)


@pytest.mark.parametrize("fault", sorted(CASES))
def test_planted_fault_is_caught_where_it_lives(fault: str, tmp_path: Path, cache: str) -> None:
    check, model, options, points_right = CASES[fault]
    clean = _run(check, model, tmp_path, cache, None, **options)
    assert clean.status is Status.PASS, f"{check} without the fault: {clean.summary}"
    caught = _run(check, model, tmp_path, cache, fault, **options)
    assert caught.status is Status.FAIL, f"{check} with {fault} planted: {caught.summary}"
    points_right(caught)


def test_conv_stride_in_a_pytorch_model_names_its_fx_node_and_module(tmp_path: Path, cache: str) -> None:
    """Layerwise against PyTorch eager: the first bad layer names the FX node, its module path and model.c."""
    torch = pytest.importorskip("torch")
    from torch import nn

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1)).eval()
    source = ModelSource("torch", net, [torch.randn(1, 3, 17, 17)])
    check = get_check("layerwise")({})
    clean = check.run(VerifyContext(source, ["native"], work_dir=tmp_path / "clean", cache_dir=cache))[0]
    assert clean.status is Status.PASS and clean.details["oracle"] == "PyTorch eager", clean.summary
    # native fuses conv + relu: the first layer is that group, its value the relu's
    assert clean.details["series"][0]["source_node"] == "relu (1)"
    with cuvil.faults.plant("conv-stride"):
        r = check.run(VerifyContext(source, ["native"], work_dir=tmp_path / "fault", cache_dir=cache))[0]
    assert r.status is Status.FAIL and "PyTorch eager" in r.summary
    assert r.where["source_node"] == "relu (1)" and r.where["layer"] == clean.details["series"][0]["value"], r.where
    assert "model.c:" in r.where["code"], r.where


def conv_with_a_nan_channel() -> onnx.ModelProto:
    """x[1,3,33] -> conv (1-D: kernel 3, stride 2, pad 1) -> y[1,8,17], the bias of output channel 0 NaN.

    Channel 0 of the layer is NaN in every build and in the reference, at the same places; the other
    channels are finite, so an error there must show however many NaNs the two sides share.  (1-D:
    the layout pass leaves it in NCHW, the kernel conv-stride is planted in.)"""
    bias = (np.random.default_rng(2).standard_normal(8) * 0.3).astype(np.float32)
    bias[0] = np.nan
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", strides=[2], pads=[1, 1])]
    return onnx_model(nodes, [f32("x", [1, 3, 33])], [f32("y", [1, 8, 17])],
                      [_weights("w", 8, 3, 3, seed=1), numpy_helper.from_array(bias, "b")])


def test_layerwise_catches_an_error_beside_nans_both_sides_share(tmp_path: Path, cache: str) -> None:
    """A NaN at the same place in the compiled layer and in its oracle is left out of the comparison, not
    taken for agreement of the whole layer: conv-stride's error in the finite channels is caught."""
    clean = _run("layerwise", conv_with_a_nan_channel, tmp_path, cache, None)
    assert clean.status is Status.PASS, clean.summary
    (layer,) = clean.details["series"]
    assert layer["value"] == "y" and layer["rel_l2"] < 1e-6, layer  # the shared NaNs agree
    caught = _run("layerwise", conv_with_a_nan_channel, tmp_path, cache, "conv-stride")
    assert caught.status is Status.FAIL, caught.summary
    (layer,) = caught.details["series"]
    assert 1e-2 < layer["rel_l2"] < np.inf and 0 < layer["max_abs"] < np.inf, layer
    assert caught.where["layer"] == "y" and caught.where["node"] == "conv", caught.where
    got, want = caught.tensors["y.compiled"], caught.tensors["y.oracle"]
    assert np.isnan(got[0, 0]).all() and np.isnan(want[0, 0]).all()  # NaNs on both sides, at the same places
    assert np.isfinite(got[0, 1:]).all() and np.isfinite(want[0, 1:]).all()

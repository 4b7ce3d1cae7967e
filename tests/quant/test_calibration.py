"""Calibration: observers, range methods, quantization parameters, data adapters and determinism."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import DimExpr
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.quant.calibrate import RunnerOptions, batched_feeds, observe
from cuvil.quant.data import CalibrationDataError, calibration_set
from cuvil.quant.observers import BINS, CalibrationError, TensorObserver, activation_qparams, quantize_weight

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "cuvil" / "examples" / "tiny_cnn.onnx")


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("build-cache"))


def _observer(chunks: list[np.ndarray], method: str, symmetric: bool) -> TensorObserver:
    from cuvil.quant.observers import histogram_kind

    o = TensorObserver("t")
    for c in chunks:
        o.observe_range(c)
    kind = histogram_kind(method, symmetric)
    if kind is not None:
        o.start_histogram(*kind)
        for c in chunks:
            o.observe_histogram(c)
    return o


def test_minmax_symmetric_and_asymmetric_parameters() -> None:
    x = np.array([-1.0, 0.5, 3.0], np.float32)
    o = _observer([x], "minmax", True)
    qp, warns = activation_qparams("t", *o.clip_range("minmax", True, 99.99), (o.min, o.max), True)
    assert qp.dtype is DType.i8 and qp.zero_point == 0
    assert qp.scale == float(np.float32(3.0 / 127))
    assert warns == []
    qp, warns = activation_qparams("t", -1.0, 3.0, (-1.0, 3.0), False)
    assert qp.dtype is DType.u8 and qp.scale == float(np.float32(4.0 / 255))
    assert qp.zero_point == int(np.rint(1.0 / qp.scale))  # 0 maps exactly onto a code
    assert warns == []


def test_percentile_clips_rare_outliers() -> None:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 200_000).astype(np.float32)
    x[:5] = 50.0  # 0.0025% of the values: beyond the 99.99th percentile
    o = _observer([x], "percentile", True)
    lo, hi = o.clip_range("percentile", True, 99.99)
    width = 50.0 / BINS
    assert 1.0 - width <= hi <= 1.0 + 2 * width and lo == max(float(x.min()), -hi)  # never past what was seen
    lo, hi = _observer([x], "percentile", False).clip_range("percentile", False, 99.99)
    assert lo <= -0.99 and hi <= 1.0 + 52.0 / BINS


def test_entropy_threshold_ignores_outliers_and_relu_zeros() -> None:
    rng = np.random.default_rng(1)
    g = rng.standard_normal(400_000).astype(np.float32)
    g[:3] = 40.0
    lo, hi = _observer([g], "entropy", True).clip_range("entropy", True, 99.99)
    assert 2.5 < hi < 12.0 and lo == -hi  # far below the outliers, well above the bulk's sigma
    relu = np.maximum(g, 0.0)  # half the values exactly 0: must not drag the threshold down
    _, hi2 = _observer([relu], "entropy", True).clip_range("entropy", True, 99.99)
    assert hi2 > 2.5


def test_histograms_do_not_depend_on_sample_order_or_grouping() -> None:
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(1000).astype(np.float32) * (i + 1) for i in range(6)]
    for method in ("percentile", "entropy"):
        a = _observer(xs, method, True)
        b = _observer([np.concatenate(xs[::-1])], method, True)
        assert a.hist is not None and b.hist is not None
        assert np.array_equal(a.hist, b.hist)
        assert a.clip_range(method, True, 99.9) == b.clip_range(method, True, 99.9)


def test_warnings_one_sided_symmetric_and_zero_point_outside_range() -> None:
    _, warns = activation_qparams("relu_out", 0.0, 6.0, (0.0, 6.0), True)
    assert len(warns) == 1 and "'relu_out'" in warns[0] and "one-sided" in warns[0] and "symmetric=False" in warns[0]
    _, warns = activation_qparams("mostly_pos", -0.1, 6.0, (-0.1, 6.0), True)  # |min| < 5% of max
    assert len(warns) == 1 and "'mostly_pos'" in warns[0]
    qp, warns = activation_qparams("shifted", 5.0, 10.0, (5.0, 10.0), False)
    assert len(warns) == 1 and "'shifted'" in warns[0] and "zero point would be -255" in warns[0]
    assert qp.zero_point == 0 and qp.lo == 0.0  # widened to include 0


def test_nonfinite_activation_is_refused() -> None:
    o = TensorObserver("act")
    with pytest.raises(CalibrationError, match="'act' holds an infinite value"):
        o.observe_range(np.array([1.0, np.inf], np.float32))


def test_weights_per_channel_round_trip_within_half_a_step() -> None:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * np.arange(1, 9, dtype=np.float32)[:, None, None, None]
    w[5] = 0.0
    q, s = quantize_weight("w", w, 0)
    assert q.dtype == np.int8 and s.shape == (8,) and s[5] == 1.0 and np.abs(q).max() == 127
    back = q.astype(np.float32) * s[:, None, None, None]
    assert np.all(np.abs(back - w) <= s[:, None, None, None] / 2 * (1 + 1e-6))


# data adapters -------------------------------------------------------------------------------------


def _graph(batch: int | str = "batch", max_batch: int | None = None) -> Graph:
    b = Builder()
    d = DimExpr.symbol(batch) if isinstance(batch, str) else batch
    x = b.input("x", TensorType(DType.f32, (d, 4)))
    w = b.constant(np.eye(4, dtype=np.float32))
    b.output(b.add1("relu", [b.add1("matmul", [x, w])]))
    if isinstance(batch, str):
        b.graph.symbols[batch] = SymbolInfo(batch, 1, max_batch)
    return b.graph


def test_dataloader_batches_are_split_to_what_the_model_takes() -> None:
    torch = pytest.importorskip("torch")
    ds = torch.utils.data.TensorDataset(torch.randn(20, 4))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    items = ([x] for (x,) in loader)
    c = calibration_set(items, _graph(1))
    assert c.examples == 20 and len(c.feeds) == 20 and c.feeds[0][0].shape == (1, 4)
    c = calibration_set([[x] for (x,) in loader], _graph("batch", 5))
    assert c.examples == 20 and [f[0].shape[0] for f in c.feeds] == [5, 3, 5, 3, 4]
    c = calibration_set(loader, _graph("batch", 5))  # the loader itself: its batches are 1-tuples
    assert c.examples == 20 and [f[0].shape[0] for f in c.feeds] == [5, 3, 5, 3, 4]


def test_samples_as_dicts_arrays_and_npz_folder(tmp_path: Path) -> None:
    g = _graph()
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(3)]
    assert calibration_set([{"x": x} for x in xs], g).examples == 6
    assert calibration_set(xs, g).examples == 6
    for i, x in enumerate(xs):
        np.savez(tmp_path / f"{i:03d}.npz", x) if i % 2 else np.savez(tmp_path / f"{i:03d}.npz", x=x)
    c = calibration_set(str(tmp_path), g)
    assert c.examples == 6 and all(np.array_equal(f[0], x) for f, x in zip(c.feeds, xs))


@pytest.mark.parametrize(("data", "message"), [
    ([(np.zeros((1, 4), np.float32), np.int64(3))], r"has 2 items, the model takes 1 inputs \['x'\] \(a dataset of "
                                                    r"\(input, label\) pairs\? give the inputs only\)"),
    ([np.zeros((1, 4), np.float64)], "input 'x': element type float64, the model takes f32"),
    ([{"y": np.zeros((1, 4), np.float32)}], r"missing 'x'; unknown 'y'"),
    (np.zeros((3, 1, 4), np.float32), "calibration_dataset must be a DataLoader"),
    ([np.zeros((1, 4), np.float32), np.zeros((0, 4), np.float32)],
     r"calibration sample 1 holds no examples: input 'x' has 0 rows along the batch axis"),
])
def test_bad_samples_are_refused_with_what_is_wrong(data: object, message: str) -> None:
    with pytest.raises(CalibrationDataError, match=message):
        calibration_set(data, _graph())


def test_npz_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(CalibrationDataError, match=r"holds no \.npz files"):
        calibration_set(str(tmp_path), _graph())
    np.savez(tmp_path / "a.npz", z=np.zeros((1, 4), np.float32))
    with pytest.raises(CalibrationDataError, match=r"holds \['z'\]; expected the model's inputs \['x'\]"):
        calibration_set(str(tmp_path), _graph())


def test_observe_watches_graph_inputs_and_node_outputs(build_cache: str) -> None:
    g = _graph()
    rng = np.random.default_rng(0)
    c = calibration_set([rng.standard_normal((2, 4)).astype(np.float32) for _ in range(4)], g)
    relu_out = g.outputs[0]
    obs, runner = observe(g, [g.inputs[0], relu_out], c, "minmax", True, RunnerOptions(cache_dir=build_cache))
    assert runner.kind == "native" and runner.calls == 2  # four feeds of 2: the first alone, then one call of 6
    allx = np.concatenate([f[0] for f in c.feeds])
    assert obs[g.inputs[0]].min == float(allx.min()) and obs[relu_out].min == 0.0
    assert obs[relu_out].max == float(np.maximum(allx, 0).max())


_DETERMINISM = """
import sys, numpy as np
sys.path.insert(0, {repo!r})
import cuvil
rng = np.random.default_rng(0)
data = [(rng.standard_normal((8, 3, 32, 32)).astype(np.float32),) for _ in range(8)]
q = cuvil.compile("cuvil/examples/tiny_cnn.onnx", "ref", quant_dtype="int8", calibration_dataset=data,
                  calibration="entropy", symmetric=False, cc="/nonexistent/cc")
assert q.info.precision["quantization"]["runner"]["runner"] == "reference"
acts = q.info.precision["quantization"]["activations"]
out = b"".join(np.float32(a["scale"]).tobytes() + np.int64(a["zero_point"]).tobytes() for a in acts.values())
ws = [n.attrs["value"].tobytes() for n in q.graph.nodes if n.op == "constant" and n.name.endswith(("_scale", "_int8"))]
sys.stdout.write((out + b"".join(ws)).hex())
"""


def test_reference_calibration_is_byte_identical_whatever_the_blas_threads() -> None:
    """Without a C compiler the reference interpreter runs the graph, its convolutions through the BLAS
    under NumPy: scales, zero points and quantized weights with that BLAS on 1 and on 2 threads."""
    outs = []
    for threads in ("1", "2"):
        env = {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "PATH": "/usr/bin:/bin"}
        r = subprocess.run([sys.executable, "-c", _DETERMINISM.format(repo=str(REPO))], capture_output=True,
                           text=True, env=env, cwd=REPO, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout)
    assert outs[0] and outs[0] == outs[1]


# how the float32 graph runs ------------------------------------------------------------------------


def _cnn() -> Graph:
    """tiny_cnn.onnx (symbolic batch) as PTQ sees it, after the passes up to fold-batchnorm."""
    from cuvil.api import import_model
    from cuvil.passes import PassManager
    from cuvil.quant.ptq import split_pipeline

    return PassManager(split_pipeline("native", True)[0]).run(import_model(TINY, None))


def _watched(g: Graph) -> list[Any]:
    from cuvil.quant.ptq import _activations, plan

    return _activations(g, plan(g, True)[0])


def _cnn_feeds(g: Graph, n: int, batch: int = 1) -> Any:
    rng = np.random.default_rng(4)
    return calibration_set([rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) for _ in range(n)], g)


def _stats(obs: dict[Any, TensorObserver]) -> list[tuple[float, float, int, bytes]]:
    return [(o.min, o.max, o.count, b"" if o.hist is None else o.hist.tobytes()) for o in obs.values()]


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_batched_calls_give_byte_identical_statistics(method: str, build_cache: str) -> None:
    """40 single-image feeds in calls of 1 + 16 + 16 + 7 images, against 40 calls of one image."""
    g = _cnn()
    acts, calib = _watched(g), _cnn_feeds(g, 40)
    one, r1 = observe(g, acts, calib, method, True, RunnerOptions(cache_dir=build_cache, batch=1))
    many, r16 = observe(g, acts, calib, method, True, RunnerOptions(cache_dir=build_cache, batch=16))
    passes = 1 if method == "minmax" else 2
    assert r1.kind == r16.kind == "native" and (r1.calls, r16.calls) == (40 * passes, 4 * passes)
    assert r16.batch == 16  # tiny_cnn's watched tensors are far below CALL_BYTES per image
    assert _stats(one) == _stats(many)


def test_batching_keeps_within_the_batch_dims_maximum_and_other_dims() -> None:
    g = _graph("batch", max_batch=5)
    f = [(np.zeros((k, 4), np.float32),) for k in (2, 2, 2, 1, 6, 1)]
    assert [x[0].shape[0] for x in batched_feeds(g, f, 16)] == [4, 3, 6, 1]
    assert [x[0].shape[0] for x in batched_feeds(g, f, 1)] == [2, 2, 2, 1, 6, 1]
    assert len(batched_feeds(_graph(1), [(np.zeros((1, 4), np.float32),)] * 3, 16)) == 3  # batch fixed at 1


def test_native_statistics_agree_with_the_reference_interpreter(build_cache: str) -> None:
    """Float32 native and reference results differ at most in the last bits: so do the ranges."""
    from cuvil.quant.calibrate import _reference_runner

    g = _cnn()
    acts, calib = _watched(g), _cnn_feeds(g, 8, batch=2)
    native, rn = observe(g, acts, calib, "minmax", True, RunnerOptions(cache_dir=build_cache))
    computed = [v for v in acts if v not in g.inputs]
    ref, rr = observe(g, acts, calib, "minmax", True, runner=_reference_runner(g, computed, "test"))
    assert rn.kind == "native" and rr.kind == "reference"
    for v in acts:
        a, b = native[v], ref[v]
        assert a.count == b.count
        for x, y in ((a.min, b.min), (a.max, b.max)):
            assert abs(x - y) <= 1e-5 * max(abs(y), 1.0), v.name


def test_without_a_c_compiler_the_reference_runs_it_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    import cuvil

    with caplog.at_level(logging.INFO, logger="cuvil.quant"):
        m = cuvil.compile(TINY, "ref", cc="/nonexistent/cc", quant_dtype="int8",
                          calibration_dataset=_images_for_tiny(64))
    logged = [r.getMessage() for r in caplog.records if r.name == "cuvil.quant" and r.levelno == logging.INFO]
    assert any("calibration runs on the reference interpreter" in w and "/nonexistent/cc" in w for w in logged)
    assert m.info.precision is not None
    runner = m.info.precision["quantization"]["runner"]
    assert runner["runner"] == "reference" and "no C compiler" in runner["why"] and "/nonexistent/cc" in runner["why"]


@pytest.mark.slow  # calibrates and builds a model twice: tens of seconds
def test_calibration_build_is_cached_in_the_compiles_cache_dir(tmp_path: Path) -> None:
    import cuvil

    data = _images_for_tiny(64)
    runs = [cuvil.compile(TINY, "ref", cache_dir=str(tmp_path), quant_dtype="int8", calibration_dataset=data)
            for _ in range(2)]
    infos = [m.info.precision["quantization"] for m in runs if m.info.precision is not None]
    assert [i["runner"]["build_cached"] for i in infos] == [False, True]
    assert infos[0]["runner"]["runner"] == "native" and infos[0]["activations"] == infos[1]["activations"]
    assert list(tmp_path.glob("*/*/model.so"))  # the build is in the compile's cache


def _images_for_tiny(n: int) -> list[tuple[np.ndarray]]:
    rng = np.random.default_rng(6)
    return [(rng.standard_normal((1, 3, 32, 32)).astype(np.float32),) for _ in range(n)]


def test_native_calibration_is_byte_identical_whatever_the_thread_count(build_cache: str) -> None:
    """Scales and zero points (entropy, asymmetric: histograms too) with the calibration build on 1 and 2 threads."""
    from cuvil.quant.observers import activation_qparams

    g = _cnn()
    acts, calib = _watched(g), _cnn_feeds(g, 24, batch=2)
    outs = []
    for threads in (1, 2):
        obs, runner = observe(g, acts, calib, "entropy", False, RunnerOptions(cache_dir=build_cache,
                                                                               num_threads=threads))
        assert runner.kind == "native"
        qps = [activation_qparams(v.name, *obs[v].clip_range("entropy", False, 99.99), (obs[v].min, obs[v].max),
                                  False)[0] for v in acts]
        outs.append((_stats(obs), b"".join(np.float32(q.scale).tobytes() + np.int64(q.zero_point).tobytes()
                                            for q in qps)))
    assert outs[0] == outs[1]


def test_calls_are_sized_by_the_bytes_they_watch(build_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose watched tensors fill CALL_BYTES with one example runs one example per call."""
    from cuvil.quant import calibrate

    g = _cnn()
    acts, calib = _watched(g), _cnn_feeds(g, 10)
    whole, _ = observe(g, acts, calib, "minmax", True, RunnerOptions(cache_dir=build_cache))
    monkeypatch.setattr(calibrate, "CALL_BYTES", 1)
    single, runner = observe(g, acts, calib, "minmax", True, RunnerOptions(cache_dir=build_cache))
    assert (runner.batch, runner.calls) == (1, 10) and _stats(single) == _stats(whole)

"""Calibration: observers, range methods, quantization parameters, data adapters and determinism."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import DimExpr
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.quant.calibrate import observe
from cuvil.quant.data import CalibrationDataError, calibration_set
from cuvil.quant.observers import BINS, CalibrationError, TensorObserver, activation_qparams, quantize_weight

REPO = Path(__file__).resolve().parents[2]


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


def test_observe_watches_graph_inputs_and_node_outputs() -> None:
    g = _graph()
    rng = np.random.default_rng(0)
    c = calibration_set([rng.standard_normal((2, 4)).astype(np.float32) for _ in range(4)], g)
    relu_out = g.outputs[0]
    obs = observe(g, [g.inputs[0], relu_out], c, "minmax", True)
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
                  calibration="entropy", symmetric=False)
acts = q.info.precision["quantization"]["activations"]
out = b"".join(np.float32(a["scale"]).tobytes() + np.int64(a["zero_point"]).tobytes() for a in acts.values())
ws = [n.attrs["value"].tobytes() for n in q.graph.nodes if n.op == "constant" and n.name.endswith(("_scale", "_int8"))]
sys.stdout.write((out + b"".join(ws)).hex())
"""


def test_calibration_is_byte_identical_whatever_the_thread_count() -> None:
    """Scales, zero points and quantized weights, with the BLAS under NumPy on 1 and on 2 threads."""
    outs = []
    for threads in ("1", "2"):
        env = {"OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads, "PATH": "/usr/bin:/bin"}
        r = subprocess.run([sys.executable, "-c", _DETERMINISM.format(repo=str(REPO))], capture_output=True,
                           text=True, env=env, cwd=REPO, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout)
    assert outs[0] and outs[0] == outs[1]

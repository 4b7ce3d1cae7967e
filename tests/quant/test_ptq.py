"""int8 post-training quantization end to end: refusals, warnings, the quantized IR, accuracy, QAT import, CLI."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuvil
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import DimExpr
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.metrics import relative_l2
from cuvil.quant.calibrate import CoverageError
from cuvil.quant.ptq import QuantizationError
from cuvil.verify.runner import target_unavailable

TINY = str(Path(__file__).resolve().parents[2] / "cuvil" / "examples" / "tiny_cnn.onnx")


@pytest.fixture(autouse=True, scope="module")
def _private_build_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Calibration builds a native library even for ``ref`` compiles: into this module's own cache."""
    root = tmp_path_factory.mktemp("build-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("cuvil.backends.c.cache.default_cache_dir", lambda: root)
        yield


def _images(n: int, seed: int = 0, batch: int = 1) -> list[tuple[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32),) for _ in range(n)]


def _mlp(shift: float = 0.0, seq: str | None = None) -> Graph:
    """x[b, (seq,) 8] (+ shift) -> matmul -> relu -> matmul: a graph built in the test."""
    b = Builder()
    shape: tuple[Any, ...] = (DimExpr.symbol("batch"), DimExpr.symbol(seq), 8) if seq else (DimExpr.symbol("batch"), 8)
    x = b.input("x", TensorType(DType.f32, shape))
    rng = np.random.default_rng(0)
    if shift:
        x = b.add1("add", [x, b.constant(np.float32(shift))], names=["shifted"])
    h = b.add1("matmul", [x, b.constant(rng.standard_normal((8, 16)).astype(np.float32))], names=["h"])
    r = b.add1("relu", [h], names=["r"])
    b.output(b.add1("matmul", [r, b.constant(rng.standard_normal((16, 4)).astype(np.float32))], names=["y"]))
    b.graph.symbols["batch"] = SymbolInfo("batch", 1, 64)
    if seq:
        b.graph.symbols[seq] = SymbolInfo(seq, 1, 512)
    return b.graph


def _vectors(n: int, shape: tuple[int, ...] = (1, 8)) -> list[tuple[np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(shape).astype(np.float32),) for _ in range(n)]


# refusals -----------------------------------------------------------------------------------------


def test_int8_without_calibration_data_is_refused() -> None:
    with pytest.raises(QuantizationError, match="needs calibration data to choose its scales: pass calibration_dataset="):
        cuvil.compile(_mlp(), "ref", quant_dtype="int8")


def test_an_empty_calibration_dataset_is_refused() -> None:
    from cuvil.quant.data import CalibrationDataError

    with pytest.raises(CalibrationDataError, match="the calibration dataset holds no samples"):
        cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=iter([]), min_calibration_samples=1)


def test_fewer_than_64_samples_are_refused_unless_overridden() -> None:
    with pytest.raises(QuantizationError, match=r"got 10 samples, fewer than the 64 required: give at least 64 samples"
                                                r".*min_calibration_samples=10 \(on the command line: "
                                                r"--min-calibration-samples 10\)"):
        cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(10))
    m = cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(10), min_calibration_samples=10)
    assert m.info.precision is not None and m.info.precision["quantization"]["examples"] == 10
    with pytest.raises(QuantizationError, match="got 10 samples, fewer than the 20 required: give more samples"):
        cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(10), min_calibration_samples=20)


def test_too_few_samples_are_refused_before_the_calibration_build(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_build(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the calibration build was made")

    monkeypatch.setattr("cuvil.quant.ptq.calibration_runner", no_build)
    with pytest.raises(QuantizationError, match="got 10 samples, fewer than the 64 required"):
        cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(10))


def test_batched_samples_count_their_examples() -> None:
    m = cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(8, (8, 8)))
    assert m.info.precision is not None and m.info.precision["quantization"]["examples"] == 64


def _sequence_first() -> Graph:
    """x[seq, 4] -> x - mean over the sequence -> matmul -> relu -> matmul: axis 0 is symbolic but no batch."""
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (DimExpr.symbol("seq"), 4)))
    m = b.add1("reduce_mean", [x, b.constant(np.array([0], np.int64))], {"keepdims": 1}, names=["mean"])
    c = b.add1("sub", [x, m], names=["centered"])
    rng = np.random.default_rng(0)
    h = b.add1("matmul", [c, b.constant(rng.standard_normal((4, 8)).astype(np.float32))], names=["h"])
    r = b.add1("relu", [h], names=["r"])
    b.output(b.add1("matmul", [r, b.constant(rng.standard_normal((8, 2)).astype(np.float32))], names=["y"]))
    b.graph.symbols["seq"] = SymbolInfo("seq", 1, 64)
    return b.graph


@pytest.mark.parametrize("target", ["ref", "native"])
def test_a_sequence_first_axis_is_not_taken_for_a_batch(target: str, tmp_path: Path) -> None:
    """Sequences are neither counted as examples row by row nor concatenated into longer ones: each
    calibrates alone, so the range of 'centered' is the largest any one sequence reaches."""
    rng = np.random.default_rng(1)
    data = [((i * 10.0 + rng.standard_normal((3 + i % 5, 4))).astype(np.float32),) for i in range(64)]
    m = cuvil.compile(_sequence_first(), target, quant_dtype="int8", calibration_dataset=data,
                      cache_dir=str(tmp_path))
    assert m.info.precision is not None
    q = m.info.precision["quantization"]
    assert q["examples"] == 64 and q["feeds"] == 64 and q["runner"]["batch"] == 1
    true = max(float(np.abs(x - x.mean(0, keepdims=True)).max()) for (x,) in data)
    assert q["activations"]["centered"]["range"][1] == pytest.approx(true, rel=1e-5)
    with pytest.raises(QuantizationError, match="int8 calibration got 13 samples, fewer than the 64 required"):
        cuvil.compile(_sequence_first(), target, quant_dtype="int8", calibration_dataset=data[:13],
                      cache_dir=str(tmp_path))
    with pytest.raises(CoverageError, match="every sample has seq=5"):  # the sequence length is a declared range
        cuvil.compile(_sequence_first(), target, quant_dtype="int8", cache_dir=str(tmp_path),
                      calibration_dataset=[x for x in data if x[0].shape[0] == 5] * 6)


def test_calibration_that_never_varies_a_declared_dim_is_refused() -> None:
    data = _vectors(64, (1, 16, 8))
    with pytest.raises(CoverageError, match=r"never exercises the range of symbolic dim 'seq': every sample has "
                                            r"seq=16, but the model declares seq in 1\.\.512.*dims=\{'seq': 16\}"):
        cuvil.compile(_mlp(seq="seq"), "ref", quant_dtype="int8", calibration_dataset=data)
    rng = np.random.default_rng(0)
    varied = [(rng.standard_normal((1, 4 + i % 3, 8)).astype(np.float32),) for i in range(64)]
    cuvil.compile(_mlp(seq="seq"), "ref", quant_dtype="int8", calibration_dataset=varied)  # seq takes 3 values
    cuvil.compile(_mlp(seq="seq"), "ref", quant_dtype="int8", calibration_dataset=data, dims={"seq": 16})


@pytest.mark.parametrize(("kw", "message"), [
    ({"quant_dtype": "int4"}, r"quant_dtype='int4' is not supported; choose one of \('int8',\)"),
    ({"quant_dtype": "int8", "calibration": "mse"}, "calibration='mse' is not a calibration method"),
    ({"quant_dtype": "int8", "passes": "dce"}, "cannot be combined with passes="),
    ({"quant_dtype": "int8", "precision": "fp16"}, "cannot be combined"),
    ({"quant_dtype": "int8", "symmetric": "no"}, "symmetric='no' must be True or False"),
    ({"quant_dtype": "int8", "per_channel": "False"}, "per_channel='False' must be True or False"),
    ({"quant_dtype": "int8", "reduce_range": "yes"}, "reduce_range='yes' must be True or False"),
])
def test_bad_options_are_refused(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(QuantizationError, match=message):
        cuvil.compile(_mlp(), "ref", calibration_dataset=_vectors(64), **kw)


def test_int8_products_name_each_targets_multiply_path(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil.backends.c.toolchain import int8_products

    assert [int8_products(t) for t in ("ref", "generic", "wasm32", "x86_avx2", "x86_avx512")] == [
        "portable", "portable", "portable", "bytes", "int16"]
    for flags, want in (({"avx2", "avx512bw", "avx512_vnni"}, "vnni"), ({"avx2", "avx512bw"}, "int16"),
                        ({"avx2", "fma"}, "bytes"), ({"sse4_2"}, "portable")):
        monkeypatch.setattr("cuvil.backends.c.toolchain.cpu_flags", lambda f=flags: frozenset(f))
        assert int8_products("native") == want, flags


def _weight_bytes(m: Any) -> list[np.ndarray]:
    """The int8 weight constants of a quantized build's graph."""
    return [n.attrs["value"] for n in m.graph.nodes if n.op == "constant" and n.outputs[0].name.endswith("_int8")]


@pytest.mark.parametrize(("target", "reduce_range", "qmax"), [
    *[pytest.param(*p, marks=pytest.mark.skipif(target_unavailable("x86_avx2") is not None, reason="needs AVX2"))
      for p in (("x86_avx2", None, 64), ("x86_avx2", False, 127))],
    ("generic", None, 127), ("ref", True, 64)])
def test_reduce_range_follows_the_targets_int8_kernels(target: str, reduce_range: bool | None, qmax: int,
                                                      tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """7-bit weights by default where the int8 kernels multiply them faster (AVX2's byte path), 8-bit
    elsewhere; either on request; the choice logged and recorded."""
    kw: dict[str, Any] = {} if reduce_range is None else {"reduce_range": reduce_range}
    with caplog.at_level(logging.INFO, logger="cuvil"):
        m = cuvil.compile(_mlp(), target, cache_dir=str(tmp_path), quant_dtype="int8", calibration_dataset=_vectors(64),
                          **kw)
    assert m.info.precision is not None
    q = m.info.precision["quantization"]
    assert q["weight_range"] == [-qmax, qmax] and q["reduce_range"] == (qmax == 64)
    weights = _weight_bytes(m) if target == "ref" else []
    assert all(int(np.abs(w).max()) == qmax for w in weights)  # per channel: each channel's largest is qmax
    assert f"weights in [-{qmax}, {qmax}]" in caplog.text
    assert ("(reduce_range): on x86_avx2 the int8 kernels multiply 7-bit weights" in caplog.text) == (
        target == "x86_avx2" and reduce_range is None)


def test_reduced_range_weights_are_7_bit_per_channel() -> None:
    m = cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(64), reduce_range=True)
    full = cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(64), reduce_range=False)
    for w7, w8 in zip(_weight_bytes(m), _weight_bytes(full), strict=True):
        assert w7.dtype == np.int8 and np.all(np.abs(w7).max(axis=0) == 64)
        assert np.all(np.abs(w8).max(axis=0) == 127)
        assert np.abs(w7.astype(int) - np.rint(w8 * (64 / 127))).max() <= 1  # the same weights, coarser


# warnings -----------------------------------------------------------------------------------------


def test_symmetric_one_sided_warning_is_logged_and_recorded(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cuvil.quant"):
        m = cuvil.compile(_mlp(), "ref", quant_dtype="int8", calibration_dataset=_vectors(64))
    logged = [r.getMessage() for r in caplog.records if r.name == "cuvil.quant" and r.levelno == logging.WARNING]
    assert any("tensor 'r'" in w and "one-sided" in w for w in logged)  # the relu output
    assert m.info.precision is not None
    assert any("tensor 'r'" in w for w in m.info.precision["quantization"]["warnings"])
    assert not any("tensor 'x'" in w for w in logged)  # a two-sided input: no warning


def _relu_stack(layers: int) -> Graph:
    """x[batch, 8] -> (matmul -> relu) x layers -> matmul: as many one-sided activations as layers."""
    b = Builder()
    rng = np.random.default_rng(3)
    h = b.input("x", TensorType(DType.f32, (DimExpr.symbol("batch"), 8)))
    for i in range(layers):
        w = b.constant((rng.standard_normal((8, 8)) * 0.5).astype(np.float32))
        h = b.add1("relu", [b.add1("matmul", [h, w], names=[f"h{i}"])], names=[f"r{i}"])
    b.output(b.add1("matmul", [h, b.constant(rng.standard_normal((8, 4)).astype(np.float32))], names=["y"]))
    b.graph.symbols["batch"] = SymbolInfo("batch", 1, 64)
    return b.graph


def test_many_one_sided_tensors_are_logged_as_one_warning_that_names_each(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cuvil.quant"):
        m = cuvil.compile(_relu_stack(6), "ref", quant_dtype="int8", calibration_dataset=_vectors(64))
    logged = [r.getMessage() for r in caplog.records if r.name == "cuvil.quant" and r.levelno == logging.WARNING]
    grouped = [w for w in logged if "one-sided" in w]
    assert len(grouped) == 1 and grouped[0].startswith("6 tensors have one-sided ranges"), logged
    assert all(f"'r{i}' [0, " in grouped[0] for i in range(6)) and "symmetric=False" in grouped[0]
    assert m.info.precision is not None  # the report keeps one warning per tensor
    recorded = [w for w in m.info.precision["quantization"]["warnings"] if "one-sided" in w]
    assert sorted(w.split(":")[0] for w in recorded) == [f"tensor 'r{i}'" for i in range(6)]


def test_asymmetric_zero_point_outside_range_warning(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    data = [(rng.uniform(0, 1, (1, 8)).astype(np.float32),) for _ in range(64)]
    with caplog.at_level(logging.WARNING, logger="cuvil.quant"):
        m = cuvil.compile(_mlp(shift=5.0), "ref", quant_dtype="int8", symmetric=False, calibration_dataset=data)
    logged = [r.getMessage() for r in caplog.records if r.name == "cuvil.quant"]
    assert any("tensor 'shifted'" in w and "outside 0..255" in w for w in logged)
    assert m.info.precision is not None
    assert any("tensor 'shifted'" in w and "zero point" in w for w in m.info.precision["quantization"]["warnings"])


# the quantized graph ------------------------------------------------------------------------------


def test_quantized_graph_is_explicit_and_keeps_fp32_between() -> None:
    m = cuvil.compile(TINY, "ref", quant_dtype="int8", calibration_dataset=_images(16, batch=4), symmetric=False)
    g = m.graph
    assert g is not None
    ops = [n.op for n in g.nodes]
    assert "quantize_linear" in ops and "dequantize_linear" in ops
    convs = [n for n in g.nodes if n.op == "conv"]
    for c in convs:
        x, w, b = (v.producer for v in c.inputs)  # type: ignore[union-attr]
        assert x is not None and x.op == "dequantize_linear" and w is not None and w.op == "dequantize_linear"
        assert w.inputs[0] is not None and w.inputs[0].type.dtype is DType.i8 and w.attrs["axis"] == 0
        assert b is not None and b.op == "dequantize_linear" and b.inputs[0] is not None
        assert b.inputs[0].type.dtype is DType.i32
    q = m.info.precision
    assert q is not None and q["quantization"]["nodes"] and q["layers"]
    for name, a in q["quantization"]["activations"].items():
        assert a["dtype"] == "u8" and 0 <= a["zero_point"] <= 255, name
    x = _images(1, seed=9, batch=2)[0][0]
    ref = cuvil.compile(TINY, "ref")(x)[0]
    got = m(x)[0]
    assert relative_l2(got, ref) < 0.05


def test_native_build_folds_into_integer_kernels_and_matches_ref(tmp_path: Path) -> None:
    data = _images(16, batch=4)
    # 7-bit weights on both (on an AVX2 CPU native's default, and what its byte kernels take)
    kw: dict[str, Any] = {"quant_dtype": "int8", "calibration_dataset": data, "symmetric": False, "reduce_range": True}
    n = cuvil.compile(TINY, "native", cache_dir=str(tmp_path), **kw)
    r = cuvil.compile(TINY, "ref", **kw)
    assert n.graph is not None and any(nd.op.startswith("qlinear_") for nd in n.graph.nodes)
    assert n.info.precision is not None and r.info.precision is not None
    assert n.info.precision["quantization"]["activations"] == r.info.precision["quantization"]["activations"]
    x = _images(1, seed=5, batch=3)[0][0]
    a, b = n(x)[0], r(x)[0]
    # integer kernels vs float math on dequantized values: a requantization step at most here and there
    assert relative_l2(a, b) < 0.02
    # the layers the integer kernels compute are in the native report, dequantized against float32,
    # with the figures of the reference's quantize nodes of the same names (up to a requantization step)
    native = {e["name"]: e for e in n.info.precision["layers"]}
    ref = {e["name"]: e for e in r.info.precision["layers"]}
    folded = {o.name: nd.op for nd in n.graph.nodes if nd.op.startswith("qlinear_") for o in nd.outputs}
    assert len(folded) == 3 and set(folded) <= set(native), (folded, sorted(native))
    for name, op in folded.items():
        assert native[name]["op"] == op and native[name]["dtype"] == "u8"
        assert 25 < native[name]["snr_db"] < 60
        assert native[name]["snr_db"] == pytest.approx(ref[name]["snr_db"], abs=0.05)  # a step here and there
    # the figure itself, computed here: r1's int8 form (the native graph's integer kernel, run by the
    # reference interpreter), dequantized, against r1 of the float32 graph the report compares with (the
    # passes up to fold-batchnorm: folding changes float32 values in their last bits)
    from cuvil.passes import PassManager
    from cuvil.quant.accuracy import trace
    from cuvil.quant.ptq import split_pipeline

    raw = cuvil.compile(TINY, "ref").graph
    assert raw is not None
    fp32 = PassManager(split_pipeline("native", True)[0]).run(raw)
    act = r.info.precision["quantization"]["activations"]["r1"]
    err2 = ref2 = 0.0
    for (x,) in data[:r.info.precision["samples"]]:
        want = trace(fp32, [x])["r1"].astype(np.float64)
        got = (trace(n.graph, [x])["r1_quantized"].astype(np.float64) - act["zero_point"]) * act["scale"]
        err2, ref2 = err2 + float(np.sum((got - want) ** 2)), ref2 + float(np.sum(want ** 2))
    assert native["r1_quantized"]["snr_db"] == pytest.approx(10 * np.log10(ref2 / err2), abs=1e-6)


# accuracy -----------------------------------------------------------------------------------------


def _class_data(n: int, seed: int, protos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(protos), n)
    x = protos[labels] + 0.8 * rng.standard_normal((n, 3, 32, 32))
    return x.astype(np.float32), labels


def test_cnn_top1_agreement_with_fp32(tmp_path: Path) -> None:
    """CIFAR CNN (the zoo's benchmark network) on images of 10 classes (smooth prototypes plus noise), its last layer
    fitted by ridge regression so that its top-1 is meaningful; 128 calibration images, 300 test images,
    fp32 and int8 both native builds."""
    torch = pytest.importorskip("torch")
    from tests.support.zoo.networks import BENCHMARKS as ZOO

    model = ZOO["cifar_cnn"].build()
    rng = np.random.default_rng(0)
    protos = np.kron(rng.standard_normal((10, 3, 4, 4)), np.ones((8, 8)))
    xs, labels = _class_data(256, 1, protos)
    feats: list[Any] = []
    hook = model.fc2.register_forward_hook(lambda mod, inp, out: feats.append(inp[0].detach()))
    with torch.no_grad():
        model(torch.from_numpy(xs))
    hook.remove()
    f = np.concatenate([feats[0].numpy(), np.ones((len(xs), 1), np.float32)], axis=1).astype(np.float64)
    # ridge regression: 256 samples for 257 unknowns would interpolate with huge, fragile weights
    gram = f.T @ f
    sol = np.linalg.solve(gram + 1e-2 * np.trace(gram) / len(gram) * np.eye(len(gram)), f.T @ (np.eye(10)[labels] * 4.0))
    with torch.no_grad():
        model.fc2.weight.copy_(torch.from_numpy(sol[:-1].T.astype(np.float32)))
        model.fc2.bias.copy_(torch.from_numpy(sol[-1].astype(np.float32)))
    spec = [torch.zeros(2, 3, 32, 32)]
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=512)}}
    calib = [(c,) for c in np.split(_class_data(128, 2, protos)[0], 4)]  # 4 batches of 32
    program = torch.export.export(model, tuple(spec), dynamic_shapes=dyn)  # exported once, compiled twice
    fp = cuvil.compile(program, "native", cache_dir=str(tmp_path))
    q8 = cuvil.compile(program, "native", cache_dir=str(tmp_path), quant_dtype="int8", calibration_dataset=calib)
    assert q8.graph is not None and any(n.op.startswith("qlinear_") for n in q8.graph.nodes)  # integer kernels
    test, test_labels = _class_data(300, 3, protos)
    a, b = np.argmax(fp(test)[0], axis=1), np.argmax(q8(test)[0], axis=1)
    assert np.mean(a == test_labels) > 0.9  # the fp32 model does classify
    assert np.mean(a == b) >= 0.99


@pytest.mark.parametrize("reduce_range", [False, True])
def test_transformer_encoder_output_snr(reduce_range: bool) -> None:
    torch = pytest.importorskip("torch")
    from tests.support.zoo.networks import transformer_encoder

    rng = np.random.default_rng(0)
    tokens = [(rng.integers(0, 100, (1, 16)),) for _ in range(160)]
    spec = [torch.zeros(1, 16, dtype=torch.int64)]
    model = transformer_encoder()
    fp = cuvil.compile(model, "ref", input_spec=spec)
    q8 = cuvil.compile(model, "ref", input_spec=spec, quant_dtype="int8", calibration_dataset=tokens[:128],
                       reduce_range=reduce_range)
    ref = np.concatenate([fp(t)[0] for (t,) in tokens[128:]]).astype(np.float64)
    got = np.concatenate([q8(t)[0] for (t,) in tokens[128:]]).astype(np.float64)
    snr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))
    assert snr >= 30.0


# PyTorch QAT / PT2E models ------------------------------------------------------------------------


def _qdq_per_tensor(x: Any, scale: float, zero_point: int) -> Any:
    """PT2E's int8 quantize / dequantize pair of a tensor."""
    import torch
    import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed

    qd = torch.ops.quantized_decomposed
    q = qd.quantize_per_tensor(x, scale, zero_point, -128, 127, torch.int8)
    return qd.dequantize_per_tensor(q, scale, zero_point, -128, 127, torch.int8)


def _qdq_per_channel(w: Any) -> Any:
    """PT2E's symmetric int8 pair of a weight along dim 0, scales 0.002 to 0.01."""
    import torch
    import torch.ao.quantization.fx._decomposed  # registers quantized_decomposed

    qd = torch.ops.quantized_decomposed
    s, z = torch.linspace(0.002, 0.01, w.shape[0]), torch.zeros(w.shape[0], dtype=torch.int64)
    q = qd.quantize_per_channel(w, s, z, 0, -127, 127, torch.int8)
    return qd.dequantize_per_channel(q, s, z, 0, -127, 127, torch.int8)


def test_pt2e_and_fake_quant_ops_import_with_their_scales() -> None:
    pytest.importorskip("torch")
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: Any) -> Any:
            x = _qdq_per_tensor(x, 0.02, 3)
            w = _qdq_per_channel(self.conv.weight)
            y = torch.relu(torch.nn.functional.conv2d(x, w, self.conv.bias, padding=1))
            y = torch.fake_quantize_per_tensor_affine(y, 0.05, 10, 0, 127)
            return torch.fake_quantize_per_channel_affine(y, torch.full((8,), 0.03), torch.zeros(8, dtype=torch.int32),
                                                          1, -128, 127)

    net = Net().eval()
    x = torch.randn(1, 3, 8, 8) * 2
    m = cuvil.compile(net, "ref", input_spec=[x])
    assert m.graph is not None
    qs = [n for n in m.graph.nodes if n.op == "quantize_linear"]
    assert len(qs) >= 3 and any(n.op == "clip" for n in m.graph.nodes)  # [-127, 127] and [0, 127] ranges
    scales = {float(n.inputs[1].producer.attrs["value"].reshape(-1)[0]) for n in qs  # type: ignore[union-attr]
              if n.inputs[1] is not None and n.inputs[1].producer is not None and n.inputs[1].producer.op == "constant"}
    assert {float(np.float32(0.02)), float(np.float32(0.05))} <= scales
    want = net(x).detach().numpy()
    got = m(x.numpy())[0]
    steps = np.abs(got - want) / 0.03
    assert np.mean(steps > 1e-6) < 0.01 and steps.max() <= 1.0 + 1e-5  # ties may differ by one step (docstring)


@pytest.mark.parametrize("bias", [False, True])
def test_pt2e_linear_over_a_sequence_folds_like_a_2d_one(bias: bool, tmp_path: Path) -> None:
    """``nn.Linear`` on a [batch, seq, features] input reads its dequantized weight through a
    transpose and adds its float bias after the matmul: the product folds into the integer kernel
    either way, the bias taken as int32 at x_scale * w_scale."""
    pytest.importorskip("torch")
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 8, bias=bias)

        def forward(self, x: Any) -> Any:
            y = torch.nn.functional.linear(_qdq_per_tensor(x, 0.02, 3), _qdq_per_channel(self.lin.weight), self.lin.bias)
            return _qdq_per_tensor(y, 0.05, 0)

    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 5, 16)
    m = cuvil.compile(net, "native", input_spec=[x], cache_dir=str(tmp_path))
    assert m.graph is not None
    ops = {n.op for n in m.graph.nodes}
    assert "transpose" not in ops, ops
    assert "qlinear_matmul" in ops, ops
    steps = np.abs(m(x.numpy())[0] - net(x).detach().numpy()) / 0.05
    assert steps.max() <= 1.0 + 1e-5


def _float_bias_conv(y_scale: float) -> Any:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: Any) -> Any:
            w = _qdq_per_channel(self.conv.weight)
            y = torch.relu(torch.nn.functional.conv2d(_qdq_per_tensor(x, 0.02, 3), w, self.conv.bias, padding=1))
            return _qdq_per_tensor(y, y_scale, -128)

    torch.manual_seed(1)
    return Net().eval()


def test_pt2e_float_bias_folds_as_int32_within_a_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """PT2E leaves a conv's bias float: it is taken as int32 at x_scale * w_scale (logged, with how
    far that moves a value), and the integer kernel's result stays within one step of PyTorch's."""
    torch = pytest.importorskip("torch")
    net = _float_bias_conv(0.05)
    x = torch.randn(2, 3, 12, 12) * 2
    with caplog.at_level(logging.INFO, logger="cuvil.passes.fold_qdq"):
        m = cuvil.compile(net, "native", input_spec=[x], cache_dir=str(tmp_path))
    assert m.graph is not None
    assert [n.op for n in m.graph.nodes if n.op in ("conv", "qlinear_conv")] == ["qlinear_conv"]
    bias = next(n.inputs[8] for n in m.graph.nodes if n.op == "qlinear_conv")
    assert bias is not None and bias.type.dtype is DType.i32
    logged = [r.getMessage() for r in caplog.records if "float bias" in r.getMessage()]
    assert len(logged) == 1 and "1 integer products" in logged[0] and "output steps at most" in logged[0], logged
    steps = np.abs(m(x.numpy())[0] - net(x).detach().numpy()) / 0.05
    assert steps.max() <= 1.0 + 1e-5 and np.mean(steps > 1e-6) < 0.01


def test_pt2e_float_bias_stays_float_where_int32_would_move_values(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """An output step so fine that the bias's rounding to int32 would move values by more than
    1/64 of one: the conv stays float, and the reason is logged at DEBUG."""
    torch = pytest.importorskip("torch")
    from cuvil.passes.fold_qdq import FLOAT_BIAS_STEPS

    net = _float_bias_conv(1e-6)
    x = torch.randn(1, 3, 6, 6)
    with caplog.at_level(logging.DEBUG, logger="cuvil.passes.fold_qdq"):
        m = cuvil.compile(net, "native", input_spec=[x], cache_dir=str(tmp_path))
    assert m.graph is not None
    assert "qlinear_conv" not in {n.op for n in m.graph.nodes}
    assert any("would move values by" in r.getMessage() and f"{FLOAT_BIAS_STEPS:.3g}" in r.getMessage()
               for r in caplog.records)
    assert np.abs(m(x.numpy())[0] - net(x).detach().numpy()).max() <= 1e-6 + 1e-9  # one step at most


# command line -------------------------------------------------------------------------------------


def test_cli_compile_quantize_with_npz_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from cuvil.cli import main

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    calib = tmp_path / "calib"
    calib.mkdir()
    for i, (x,) in enumerate(_images(64)):
        np.savez(calib / f"{i:03d}.npz", image=x)
    out = tmp_path / "art"
    assert main(["compile", TINY, "-t", "generic", "--quantize", "int8", "--calibration", str(calib),
                 "--calibration-method", "entropy", "--asymmetric", "--reduce-range", "-o", str(out)]) == 0
    assert "compiled" in capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    assert meta["compile"]["precision"]["quantization"]["weight_range"] == [-64, 64]
    assert meta["compile"]["precision"]["quantization"]["calibration"] == "entropy"
    assert meta["compile"]["precision"]["quantization"]["examples"] == 64
    # the artifact's report, its integer layers included: `inspect --precision ART` and `--precision int8 ART`
    for argv in (["inspect", "--precision", str(out)], ["inspect", str(out), "--precision", "int8", "--top", "20"]):
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert printed.startswith("precision: int8, 2 samples") and "qlinear_conv" in printed, printed
        assert ("quantization: weights in [-64, 64] (reduce_range) per channel, activations asymmetric uint8, "
                "entropy calibration on 64 examples") in printed, printed
    assert main(["inspect", "--precision", "fp16", str(out)]) == 2
    assert "was compiled at precision int8, not fp16" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["compile", TINY, "--quantize", "int4", "--calibration", str(calib)])
    assert main(["compile", TINY, "-t", "ref", "--calibration", str(calib)]) == 2
    assert "--calibration applies with --quantize int8 or --precision fp16/bf16" in capsys.readouterr().err
    assert main(["compile", TINY, "-t", "ref", "--no-reduce-range"]) == 2
    assert "--[no-]reduce-range apply with --quantize int8" in capsys.readouterr().err


@pytest.mark.parametrize("symmetric", [True, False])
def test_relu6_is_quantized_after_the_clip_and_folds_into_the_kernel(symmetric: bool, tmp_path: Path) -> None:
    """matmul -> clip(0, 6) -> matmul: the clip's result is the quantized tensor, so fold-qdq puts the clip
    into the integer kernel's saturation (no float clip left), and native matches ref."""
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (1, 8)))
    rng = np.random.default_rng(0)
    h = b.add1("matmul", [x, b.constant(rng.standard_normal((8, 16)).astype(np.float32))], names=["h"])
    r = b.add1("clip", [h, b.constant(np.float32(0)), b.constant(np.float32(6))], names=["r6"])
    b.output(b.add1("matmul", [r, b.constant(rng.standard_normal((16, 4)).astype(np.float32))], names=["y"]))
    kw: dict[str, Any] = {"quant_dtype": "int8", "calibration_dataset": _vectors(64), "symmetric": symmetric}
    n = cuvil.compile(b.graph, "native", cache_dir=str(tmp_path), **kw)
    r_ = cuvil.compile(b.graph, "ref", **kw)
    assert n.info.precision is not None
    assert set(n.info.precision["quantization"]["activations"]) == {"x", "r6"}
    assert n.graph is not None and "clip" not in {nd.op for nd in n.graph.nodes}
    (first,) = [nd for nd in n.graph.nodes if nd.op == "qlinear_matmul"]
    # int8 (zero point 0) clamps at the zero point; uint8 from 0 has its zero point at 0, saturation alone
    assert first.attrs["relu"] == int(symmetric)
    v = _vectors(1)[0][0]
    a, want = n(v)[0], r_(v)[0]
    assert relative_l2(a, want) < 0.02

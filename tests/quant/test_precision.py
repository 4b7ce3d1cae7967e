"""Reduced precision: the convert-precision pass, compile(precision=...), overflow refusal, overrides,
the per-layer accuracy report, and the f16/bf16 products of the C backend against the reference."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.ref.interpreter import run_graph
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.types import TensorType
from cuvil.ir.verify import verify
from cuvil.metrics import relative_l2
from cuvil.passes import DeadCodeElimination, PassError, PassManager
from cuvil.passes.convert_precision import ConvertPrecision
from cuvil.quant import PrecisionOverflowError, layer_errors
from cuvil.quant.accuracy import PrecisionReport

F32 = DType.f32


def test_golden() -> None:
    g = parse_graph("""\
graph main(%x: f32[2, 3]) {
  %w = constant() {value = dense<f32[3, 4]> [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]} : f32[3, 4]
  %b = constant() {value = dense<f32[4]> [0.5, -1.0, 0.25, 2.0]} : f32[4]
  %h = gemm(%x, %w, %b) : f32[2, 4]
  %r = relu(%h) : f32[2, 4]
  %s = softmax(%r) {axis = 1} : f32[2, 4]
  %t = mul(%s, %r) : f32[2, 4]
  %n = shape(%t) : i64[2]
  return %t, %n
}
""")
    assert ConvertPrecision(dtype="f16").run(g).changed
    DeadCodeElimination().run(g)
    verify(g)
    # Weights become f16 constants, softmax stays f32 between two casts, the output is cast back under
    # its own name, shape() reads the reduced value as it is.
    assert print_graph(g) == """\
graph main(%x: f32[2, 3]) {
  %x.f16 = cast(%x) {to = f16} : f16[2, 3] loc("x.f16")
  %w.f16 = constant() {value = dense<f16[3, 4]> [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]} : f16[3, 4] loc("w.f16")
  %b.f16 = constant() {value = dense<f16[4]> [0.5, -1.0, 0.25, 2.0]} : f16[4] loc("b.f16")
  %h = gemm(%x.f16, %w.f16, %b.f16) : f16[2, 4]
  %r = relu(%h) : f16[2, 4]
  %r.f32 = cast(%r) {to = f32} : f32[2, 4] loc("r.f32")
  %s = softmax(%r.f32) {axis = 1} : f32[2, 4]
  %s.f16 = cast(%s) {to = f16} : f16[2, 4] loc("s.f16")
  %t.f16 = mul(%s.f16, %r) : f16[2, 4]
  %n = shape(%t.f16) : i64[2]
  %t = cast(%t.f16) {to = f32} : f32[2, 4] loc("t")
  return %t, %n
}
"""


def _mlp(seed: int = 0, scale: float = 1.0) -> Graph:
    """x -> gemm -> relu -> matmul -> softmax, with named nodes."""
    rng = np.random.default_rng(seed)
    b = Builder()
    x = b.input("x", TensorType(F32, (4, 32)))
    w1 = b.constant((rng.standard_normal((32, 64)) * 0.2 * scale).astype(np.float32), name="w1")
    c1 = b.constant(rng.standard_normal(64).astype(np.float32) * 0.1, name="c1")
    h = b.add1("gemm", [x, w1, c1], names=["h"], node_name="fc1")
    r = b.add1("relu", [h], names=["r"], node_name="act")
    w2 = b.constant((rng.standard_normal((64, 10)) * 0.2).astype(np.float32), name="w2")
    z = b.add1("matmul", [r, w2], names=["z"], node_name="fc2")
    b.output(b.add1("softmax", [z], {"axis": 1}, names=["probs"], node_name="head"))
    return b.graph


def _ops(g: Graph) -> dict[str, DType]:
    return {n.name: n.outputs[0].type.dtype for n in g.nodes if n.name and n.op != "constant"}


def test_overrides() -> None:
    g = _mlp()
    PassManager("convert-precision{dtype=bf16,overrides=\"softmax=bf16;node:fc2=fp32\"}").run(g)
    verify(g)
    ops = _ops(g)
    assert ops["fc1"] is DType.bf16 and ops["act"] is DType.bf16
    assert ops["fc2"] is F32  # the node's override
    assert ops["head"] is DType.bf16  # softmax asked reduced
    assert g.outputs[0].type.dtype is F32 and g.outputs[0].name == "probs"


@pytest.mark.parametrize("overrides,message", [
    ({"softmaxx": "fp32"}, "names no op"),
    ({"softmax": "int8"}, "write fp32, fp16 or bf16"),
    ({"node:nope": "fp32"}, "nodes the graph does not have: node:nope"),
    ({"softmax": "bf16"}, "an override is f32 or f16"),
])
def test_bad_overrides(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(cuvil.CuvilError, match=message):
        cuvil.compile(_mlp(), "ref", precision="fp16", precision_overrides=overrides)


def test_unknown_precision() -> None:
    with pytest.raises(cuvil.CuvilError, match="unknown precision 'fp8'"):
        cuvil.compile(_mlp(), "ref", precision="fp8")
    with pytest.raises(PassError, match="dtype must be f16 or bf16"):
        PassManager("convert-precision{dtype=f64}")


def _overflowing() -> Graph:
    b = Builder()
    x = b.input("x", TensorType(F32, (8, 8)))
    big = b.add1("mul", [x, b.constant(np.float32(400.0))], names=["big"], node_name="scale1")
    huge = b.add1("mul", [big, b.constant(np.float32(400.0))], names=["huge"], node_name="scale2")
    b.output(b.add1("tanh", [huge], names=["y"], node_name="squash"))
    return b.graph


def test_overflow_is_refused_with_node_op_and_value() -> None:
    with pytest.raises(PrecisionOverflowError) as exc:
        cuvil.compile(_overflowing(), "ref", precision="fp16")
    msg = str(exc.value)
    assert "node 'scale2' (mul): value 'huge' reaches |x| = " in msg
    assert "beyond f16's largest finite value 65504" in msg
    assert "precision_overrides={'node:scale2': 'fp32'}" in msg
    # The measured peak is the float32 graph's: |x| * 160000 over the seeded samples.
    peak = float(msg.split("|x| = ")[1].split(",")[0])
    assert 160000 < peak < 160000 * 6


@pytest.mark.parametrize("target", ["ref", "native"])
def test_overflow_in_any_calibration_example_is_refused(target: str, tmp_path: Path) -> None:
    """The calibration set's examples all count, not only the ``precision_samples`` run in both graphs:
    one example of 10 whose |x| reaches 0.5 makes 'huge' 80000 (> 65504); the others stay at 16000."""
    calm = [(np.full((8, 8), 0.1, np.float32),) for _ in range(9)]
    data = [*calm[:6], (np.full((8, 8), -0.5, np.float32),), *calm[6:]]
    with pytest.raises(PrecisionOverflowError) as exc:
        cuvil.compile(_overflowing(), target, precision="fp16", calibration_dataset=data, cache_dir=str(tmp_path))
    msg = str(exc.value)
    assert "on the 10 calibration examples, node 'scale2' (mul): value 'huge' reaches |x| = 80000," in msg
    m = cuvil.compile(_overflowing(), target, precision="fp16", calibration_dataset=calm, cache_dir=str(tmp_path))
    assert m.info.precision is not None and m.info.precision["overflows"] == []


def test_overflow_allowed_is_recorded() -> None:
    m = cuvil.compile(_overflowing(), "ref", precision="fp16", allow_overflow=True)
    assert m.info.precision is not None
    assert [o["node"] for o in m.info.precision["overflows"]] == ["scale2"]
    assert any("allow_overflow" in n for n in m.info.notes)


def test_overflow_fixed_by_override_and_bf16() -> None:
    m = cuvil.compile(_overflowing(), "ref", precision="fp16",
                      precision_overrides={"node:scale2": "fp32", "node:squash": "fp32"})
    assert m.info.precision is not None and m.info.precision["overflows"] == []
    cuvil.compile(_overflowing(), "ref", precision="bf16")  # float32's range: nothing overflows


def test_weight_overflow() -> None:
    g = _mlp(scale=1e6)
    with pytest.raises(PrecisionOverflowError, match="weight 'w1' \\(read by node 'fc1', gemm\\) holds"):
        cuvil.compile(g, "ref", precision="fp16")


def test_layer_errors_match_values_by_name() -> None:
    g = _mlp()
    low = PassManager("convert-precision{dtype=f16},dce").run(_mlp())
    rng = np.random.default_rng(3)
    samples = [[rng.standard_normal((4, 32)).astype(np.float32)] for _ in range(2)]
    errs = {e.name: e for e in layer_errors(g, low, samples)}
    assert set(errs) == {"h", "r", "z", "probs"}
    # Against a direct computation of the same figure for the reduced gemm output h.
    want = np.concatenate([_trace(g, s)["h"].ravel() for s in samples])
    got = np.concatenate([_trace(low, s)["h"].ravel() for s in samples])
    assert errs["h"].rel_l2 == pytest.approx(relative_l2(got, want), rel=1e-9)
    assert errs["h"].op == "gemm" and errs["h"].dtype == "f16"
    assert 0 < errs["h"].rel_l2 < 2e-3 and errs["h"].snr_db > 50


def _trace(g: Graph, sample: list[np.ndarray]) -> dict[str, np.ndarray]:
    from cuvil.quant.accuracy import trace

    return trace(g, sample)


@pytest.mark.parametrize("target,precision", [("native", "fp16"), ("native", "bf16"), ("generic", "bf16")])
def test_targets_match_reference(target: str, precision: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    (want,) = cuvil.compile(_mlp(), "ref")(x)
    (ref_low,) = cuvil.compile(_mlp(), "ref", precision=precision)(x)
    m = cuvil.compile(_mlp(), target, precision=precision, cache_dir=str(tmp_path))
    (got,) = m(x)
    assert got.dtype == np.float32
    assert relative_l2(got, want) < 1e-2
    ulp = 2.0 ** (-10 if precision == "fp16" else -7)  # the reduced types' relative rounding step
    np.testing.assert_allclose(got, ref_low, rtol=4 * ulp, atol=4 * ulp * float(np.max(np.abs(ref_low))))


@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_matmul_and_gemm_kernels(dtype: DType, tmp_path: Path) -> None:
    """f16/bf16 products on native (the bf16 dot-product kernel where the CPU has AVX512_BF16)
    against the reference's float32 accumulation, within one rounding of the result."""
    rng = np.random.default_rng(2)
    b = Builder()
    a = b.input("a", TensorType(dtype, (2, 37, 51)))
    w = b.input("w", TensorType(dtype, (51, 45)))
    c = b.input("c", TensorType(dtype, (45,)))
    mm = b.add1("matmul", [a, w])
    a2 = b.add1("reshape", [a, b.constant(np.array([74, 51], np.int64))])
    gm = b.add1("gemm", [a2, w, c], {"alpha": 0.5, "beta": 2.0})
    gt = b.add1("gemm", [w, a2], {"transA": 1, "transB": 1})
    b.output(mm, gm, gt)
    ins = [rng.standard_normal(s).astype(dtype.np) for s in [(2, 37, 51), (51, 45), (45,)]]
    want = run_graph(b.graph, ins)
    got = cuvil.compile(b.graph, "native", cache_dir=str(tmp_path))(*ins)
    step = 2.0 ** (-10 if dtype is DType.f16 else -7)
    for g_, w_ in zip(got, want):
        assert g_.dtype == w_.dtype
        g64, w64 = g_.astype(np.float64), w_.astype(np.float64)
        assert np.all(np.abs(g64 - w64) <= step * np.abs(w64) + 1e-3), np.max(np.abs(g64 - w64))


def test_report_saved_loaded_and_inspected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cuvil.cli import main

    m = cuvil.compile(_mlp(), "native", precision="bf16", cache_dir=str(tmp_path / "cache"))
    assert m.info.precision is not None
    report = PrecisionReport.from_json(m.info.precision)
    assert report.precision == "bf16" and report.samples == 2
    # the bf16 gemm and its relu are one fused_gemm giving %r: %h is no value of the compiled graph
    layers = {e.name: e for e in report.layers}
    assert set(layers) >= {"r", "z", "probs"} and "h" not in layers
    assert layers["r"].op == "fused_gemm" and layers["r"].dtype == "bf16"
    m.save(tmp_path / "art")
    loaded = cuvil.load(tmp_path / "art")
    assert loaded.info.precision == json.loads(json.dumps(m.info.precision))
    assert main(["inspect", "--precision", "bf16", str(tmp_path / "art"), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "precision: bf16, 2 samples" in out
    worst = report.worst(2)
    assert worst[0].name in out and worst[1].name in out
    assert len([line for line in out.splitlines() if line.split()[0] in {"r", "z", "probs"}]) == 2



CONVS = [  # (input, weight, attributes, op): the paths of the f16/bf16 convolution kernels
    ((1, 3, 17, 19), (8, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, "conv"),  # odd K
    ((2, 16, 9, 9), (24, 16, 3, 3), {"pads": [1, 1, 1, 1]}, "conv"),  # Winograd on widened f16
    ((1, 20, 6, 5), (33, 20, 1, 1), {}, "conv"),  # the image itself is the GEMM operand
    ((1, 12, 8, 8), (12, 3, 3, 3), {"group": 4, "pads": [1, 0, 1, 2], "dilations": [2, 1]}, "conv"),
    ((2, 8, 10, 10), (8, 1, 3, 3), {"group": 8, "strides": [2, 2], "pads": [1, 1, 1, 1]}, "conv"),  # depthwise
    ((1, 6, 11), (5, 6, 4), {"strides": [3]}, "conv"),  # 1-D
    ((1, 6, 5, 5), (6, 4, 3, 3), {"strides": [2, 2]}, "conv_transpose"),
]


def _convs(dtype: DType, weights: list[np.ndarray] | None) -> Graph:
    """Every case of CONVS in one graph: weights and biases as inputs, or as constants when given."""
    b = Builder()
    outs = []
    for i, (xs, ws, attrs, op) in enumerate(CONVS):
        x = b.input(f"x{i}", TensorType(dtype, xs))
        cout = ws[1] * int(attrs.get("group", 1)) if op == "conv_transpose" else ws[0]  # type: ignore[call-overload]
        if weights is None:
            w, c = b.input(f"w{i}", TensorType(dtype, ws)), b.input(f"b{i}", TensorType(dtype, (cout,)))
        else:
            w, c = b.constant(weights[2 * i]), b.constant(weights[2 * i + 1])
        # the first case has no bias
        outs.append(b.add1(op, [x, w] if i == 0 else [x, w, c], attrs))
    b.output(*outs)
    return b.graph


@pytest.mark.slow  # every convolution path built in f16 or bf16 for the C targets: tens of seconds
@pytest.mark.parametrize("dtype", [DType.f16, DType.bf16])
def test_half_conv_kernels(dtype: DType, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """f16/bf16 convolutions (bf16 dot products on native where the CPU has AVX512_BF16, the float32
    algorithms on widened operands otherwise) against the reference's float32 accumulation, within one
    rounding of the result; weights as graph inputs, and as constants (widened or paired once per
    model: called twice, with bitwise-equal results).  A 3x3 convolution that float32 runs by
    Winograd runs it on widened operands in bf16 too (fewer multiply-adds than any direct product)."""
    rng = np.random.default_rng(4)
    g = _convs(dtype, None)
    ins = [rng.standard_normal(v.type.shape).astype(dtype.np) for v in g.inputs]  # type: ignore[arg-type]
    want = [w.astype(np.float64) for w in run_graph(g, ins)]
    step = 2.0 ** (-10 if dtype is DType.f16 else -7)

    def check(got: Sequence[np.ndarray], what: str) -> None:
        for i, (g_, w_) in enumerate(zip(got, want)):
            assert g_.dtype == dtype.np
            err = np.abs(g_.astype(np.float64) - w_)
            assert np.all(err <= step * np.abs(w_) + 1e-3), (what, CONVS[i], float(np.max(err)))

    for target in ("native", "generic"):
        with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
            check(cuvil.compile(g, target, cache_dir=str(tmp_path))(*ins), target)
    notes = [r.getMessage() for r in caplog.records if f"{dtype} by " in r.getMessage()]
    assert any(f"{dtype} by Winograd F(" in n for n in notes), notes
    if dtype is DType.bf16:
        assert any("bf16 by bf16 dot products" in n for n in notes), notes  # the 7x7 stride-2 case
    xs, params = ins[0::3], [a for i in range(len(CONVS)) for a in ins[3 * i + 1:3 * i + 3]]
    const = _convs(dtype, params)
    m = cuvil.compile(const, "native", cache_dir=str(tmp_path), num_threads=2)
    first = m(*xs)
    check(first, "constant weights")
    again = m(*xs)  # from the cached forms of the weights
    assert all(a.tobytes() == b.tobytes() for a, b in zip(first, again))


def _verify_context(graph: Graph, tmp_path: Path, options: Mapping[str, object] | None = None) -> object:
    from cuvil.verify.context import ModelSource, VerifyContext

    return VerifyContext(ModelSource("graph", graph), targets=["generic"], cache_dir=str(tmp_path / "cache"),
                         work_dir=tmp_path, config={"checks": {"precision": dict(options or {})}})


@pytest.mark.slow  # verifies a model through fp16 and bf16 builds: tens of seconds
def test_verify_precision_checks_fp16_and_bf16(tmp_path: Path) -> None:
    import cuvil.verify.checks  # noqa: F401  (registers the checks)
    from cuvil.verify.base import Status, get_check

    (r,) = get_check("precision")().run(_verify_context(_mlp(), tmp_path))
    assert r.status is Status.PASS, r.summary
    assert r.details["precisions"]["fp16"] == r.details["precisions"]["bf16"] == "checked"
    for p, bound in (("fp16", 2e-3), ("bf16", 1e-2)):
        rows = r.details[p]["outputs"]
        assert [row["output"] for row in rows] == ["probs"]
        # reduced precision is far from float32's own error, and within the gate
        assert rows[0]["source_rel_l2"] < 1e-6 < rows[0]["rel_l2"] < bound
        assert r.figures[f"{p}_rel_l2"] == rows[0]["rel_l2"]
        assert r.details["viability"][p].startswith("viable: relative L2 error")
    assert "fp16: relative L2 error" in r.summary and "bf16: relative L2 error" in r.summary


def test_verify_precision_reports_an_overflow(tmp_path: Path) -> None:
    import cuvil.verify.checks  # noqa: F401  (registers the checks)
    from cuvil.verify.base import Status, get_check

    (r,) = get_check("precision")().run(_verify_context(_overflowing(), tmp_path, {"precisions": ["fp32", "fp16"]}))
    assert r.status is Status.FAIL
    assert r.where == {"target": "generic", "precision": "fp16", "node": "scale2", "op": "mul"}
    assert "value 'huge' reaches |x| = " in r.summary and "65504" in r.summary
    assert "bf16" not in r.details  # not in the precisions asked for


def _mlp_and_scaled() -> Graph:
    """``_mlp`` with a second output ``x * 1e5``: a weight beyond f16's range."""
    g = _mlp()
    b = Builder(g)
    big = b.add1("mul", [g.inputs[0], b.constant(np.array(1e5, np.float32), name="gain")], names=["scaled"],
                 node_name="amplify")
    b.output(big)
    return b.graph


@pytest.mark.slow  # builds fp32, fp16 and bf16 three times over: tens of seconds
def test_verify_precision_fails_only_the_precisions_asked_for(tmp_path: Path) -> None:
    """A model whose fp16 build is refused (a weight beyond f16's range) and whose bf16 build misses the
    bound: by default (fp32 selected) both only warn and say why; asked for, each fails the check."""
    import cuvil.verify.checks  # noqa: F401  (registers the checks)
    from cuvil.verify.base import Status, get_check

    tight = {"reduced_max_rel_l2": 1e-5}  # bf16 (8 bits of mantissa) misses it
    (r,) = get_check("precision")().run(_verify_context(_mlp_and_scaled(), tmp_path / "default", tight))
    assert r.status is Status.WARN, r.summary
    assert r.details["selected"] == ["fp32"]
    viability = r.details["viability"]
    assert viability["fp16"].startswith("not viable: weight 'gain' (read by node 'amplify', mul) holds 100000")
    assert "precision_overrides" in viability["fp16"]
    assert viability["bf16"].startswith("not viable at the bound: relative L2 error")
    assert "not selected, so this warns" in r.summary and "fp32: relative L2 error" in r.summary
    assert r.where["precision"] == "fp16"
    for wanted in ("fp16", "bf16"):
        options = {**tight, "precisions": ["fp32", wanted]}
        (r,) = get_check("precision")().run(_verify_context(_mlp_and_scaled(), tmp_path / wanted, options))
        assert r.status is Status.FAIL and r.where["precision"] == wanted, r.summary
        assert r.details["selected"] == ["fp32", wanted]


def _half_tails() -> Graph:
    """For f16 and bf16: conv + residual * scalar -> relu, matmul + row bias -> tanh -> clip, an
    elementwise chain (add, sigmoid, mul, sub) that no product heads, and two convolutions whose
    epilogue is a clamp: -> relu (3x3, unit stride: Winograd on widened operands) and -> clip
    (stride 2: bf16 dot products where the CPU has them)."""
    b = Builder()
    outs = []
    for dt in (DType.f16, DType.bf16):
        x = b.input(f"x_{dt}", TensorType(dt, (1, 8, 6, 6)))
        w = b.input(f"w_{dt}", TensorType(dt, (8, 8, 3, 3)))
        c = b.input(f"c_{dt}", TensorType(dt, (8,)))
        r = b.input(f"r_{dt}", TensorType(dt, (1, 8, 6, 6)))
        k = b.constant(np.array(1.7, dt.np))
        conv = b.add1("conv", [x, w, c], {"pads": [1, 1, 1, 1]})
        outs.append(b.add1("relu", [b.add1("mul", [b.add1("add", [r, conv]), k])]))
        a = b.input(f"a_{dt}", TensorType(dt, (5, 24)))
        m = b.input(f"m_{dt}", TensorType(dt, (24, 7)))
        bias = b.input(f"bias_{dt}", TensorType(dt, (7,)))
        lo, hi = b.constant(np.array(-0.75, dt.np)), b.constant(np.array(0.75, dt.np))
        t = b.add1("tanh", [b.add1("add", [b.add1("matmul", [a, m]), bias])])
        outs.append(b.add1("clip", [t, lo, hi]))
        e = b.input(f"e_{dt}", TensorType(dt, (3, 7)))
        s = b.add1("sigmoid", [b.add1("add", [e, bias])])
        outs.append(b.add1("sub", [b.add1("mul", [s, b.constant(np.array(2.5, dt.np))]), e]))
        outs.append(b.add1("relu", [b.add1("conv", [x, w, c], {"pads": [1, 1, 1, 1]})]))
        strided = b.add1("conv", [r, w], {"pads": [1, 1, 1, 1], "strides": [2, 2]})
        outs.append(b.add1("clip", [strided, b.constant(np.array(-0.5, dt.np)), b.constant(np.array(0.5, dt.np))]))
    b.output(*outs)
    return b.graph


def test_half_epilogues_fuse_and_round_as_the_unfused_ops(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """f16/bf16 epilogues and elementwise chains fuse, and the fused kernels give bitwise what the
    unfused ones give (each op's result rounded to its type), as the reference's fused ops give
    bitwise what its unfused ones give; and both are within one rounding of the reference.  A
    clamp epilogue (relu, clip) runs inside the convolution, as its result is rounded."""
    g = _half_tails()
    fused = PassManager("fuse-epilogue,fuse-elementwise").run(_half_tails())
    ops = sorted(n.op for n in fused.nodes if n.op != "constant")
    assert ops == ["fused_conv"] * 6 + ["fused_elementwise", "fused_elementwise", "fused_matmul", "fused_matmul"], ops
    rng = np.random.default_rng(5)
    ins = [rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in g.inputs]  # type: ignore[arg-type]
    want = run_graph(g, ins)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(run_graph(fused, ins), want))  # the same semantics
    with caplog.at_level(logging.DEBUG, logger="cuvil.backends.c.kernel"):
        got = cuvil.compile(g, "native", passes="fuse-epilogue,fuse-elementwise", cache_dir=str(tmp_path))(*ins)
    assert sum("clamp (relu or clip) applied as the result is rounded" in r.getMessage() for r in caplog.records) == 4
    plain = cuvil.compile(g, "native", passes="", cache_dir=str(tmp_path))(*ins)
    for i, (f, p, w_) in enumerate(zip(got, plain, want)):
        assert f.dtype == p.dtype == w_.dtype
        assert f.tobytes() == p.tobytes(), (i, np.max(np.abs(f.astype(np.float64) - p)))
        step = 2.0 ** (-10 if w_.dtype == np.float16 else -7)
        w64 = w_.astype(np.float64)
        # one rounding of an intermediate (sigmoid, tanh: C's libm against NumPy's) moves the result by
        # a step of that intermediate's magnitude, which the output's largest one bounds here
        assert np.max(np.abs(f.astype(np.float64) - w64)) <= step * np.max(np.abs(w64)), i


def test_torch_samples_that_require_grad_are_read() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 32, requires_grad=True)
    m = cuvil.compile(_mlp(), "ref", precision="fp16", calibration_dataset=[(x,), (x * 2,)])
    assert m.info.precision is not None and m.info.precision["samples"] == 2


def test_samples_of_the_wrong_element_type_are_refused() -> None:
    from cuvil.errors import InputError

    x = np.random.default_rng(0).standard_normal((4, 32))
    with pytest.raises(InputError, match=r"calibration sample 0: input 'x': expected element type f32, got float64"):
        cuvil.compile(_mlp(), "ref", precision="fp16", calibration_dataset=[(x,)])
    with pytest.raises(InputError, match=r"calibration sample 1: input 'x': expected shape \[4, 32\]"):
        cuvil.compile(_mlp(), "ref", precision="fp16", calibration_dataset=[(x.astype(np.float32),)] * 1
                      + [(x[:2].astype(np.float32),)])


# command line -------------------------------------------------------------------------------------


def test_cli_compile_precision_overrides_overflow_and_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """`cuvil compile --precision fp16` refuses a value that overflows fp16, naming the node and the
    way out; --precision-override node:NAME=fp32 and --allow-overflow are those ways; --calibration
    checks every example; the float32-only options are refused without --precision."""
    import onnx
    from onnx import TensorProto, helper

    from cuvil.cli import main

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    four = helper.make_tensor("four", TensorProto.FLOAT, [], [400.0])
    g = helper.make_graph([helper.make_node("Mul", ["x", "four"], ["big"], name="scale1"),
                           helper.make_node("Mul", ["big", "four"], ["huge"], name="scale2"),
                           helper.make_node("Tanh", ["huge"], ["y"], name="squash")], "overflowing",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8])], [four])
    path = tmp_path / "overflowing.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["compile", str(path), "-t", "ref", "--precision", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "node 'scale2' (mul): value 'huge' reaches |x| = " in err and "beyond f16's largest finite value" in err
    out = tmp_path / "art"
    assert main(["compile", str(path), "-t", "generic", "--precision", "fp16",
                 "--precision-override", "node:scale2=fp32", "-o", str(out)]) == 0
    capsys.readouterr()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["compile"]["precision"]["precision"] == "fp16"
    assert meta["compile"]["precision"]["overrides"] == {"node:scale2": "fp32"}
    assert main(["compile", str(path), "-t", "ref", "--precision", "fp16", "--allow-overflow"]) == 0
    capsys.readouterr()
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(10):  # one example of 10 reaches |x| = 0.5: 'huge' is 80000 there, 16000 elsewhere
        np.savez(calib / f"{i:02d}.npz", x=np.full((8, 8), -0.5 if i == 6 else 0.1, np.float32))
    assert main(["compile", str(path), "-t", "ref", "--precision", "fp16", "--calibration", str(calib)]) == 2
    assert "on the 10 calibration examples, node 'scale2' (mul): value 'huge' reaches |x| = 80000," in \
        capsys.readouterr().err
    for argv, msg in ((["--allow-overflow"], "--allow-overflow apply with --precision fp16 or bf16"),
                      (["--precision-override", "softmax=fp16"], "--precision-override apply with --precision"),
                      (["--precision", "fp16", "--precision-override", "softmax"], "expected OP=TYPE"),
                      (["--calibration", str(calib)], "--calibration applies with --quantize int8 or "
                                                      "--precision fp16/bf16")):
        assert main(["compile", str(path), "-t", "ref", *argv]) == 2
        assert msg in capsys.readouterr().err

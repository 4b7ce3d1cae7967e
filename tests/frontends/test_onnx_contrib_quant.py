"""onnxruntime's ``com.microsoft`` quantized ops (cuvil/frontends/onnx/ops_contrib_quant.py) against
onnxruntime's CPU kernels: one-node models of each op (one model holding them all, built once per target),
the refusals, and (slow) small CNN, transformer-style and LSTM models exported from PyTorch and quantized
by onnxruntime's own ``quantize_dynamic`` / ``quantize_static(QOperator)``.

The one-node cases run on ref, native and wasm32 (DynamicQuantizeLSTM on ref and native).
Tolerances, per the output's kind:

* 8-bit outputs: ``EXACT`` cases equal onnxruntime's; ``STEP`` cases may differ by one quantization step
  where onnxruntime's kernel rounds differently (its SIMD QLinearAdd/Mul multiply by the scale ratios
  ``A_scale / C_scale`` in fixed point, its pools and softmax have their own integer or table
  arithmetic, its sigmoid table comes from its own logistic approximation), i.e. where the float value
  lies within a rounding of a tie.  Measured here: 3 of the 7,878 such values differ, each by one step.
* float outputs of the integer products: relative 1e-6 (the float32 scaling of an exact int32 sum,
  whose rounding order may differ by an ulp).
* DynamicQuantizeLSTM: absolute 1/255 = 3.9e-3 on the outputs (which lie in [-1, 1]): onnxruntime
  quantizes the hidden state of each step (per batch row) to uint8 before its product with R, which
  Cuvil keeps in float32; 1/255 is half a step of that grid over [-1, 1], the size of the rounding it
  gives H.  (Measured: at most 1.3e-3.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.errors import CuvilError, ModelError, UnsupportedOpError
from cuvil.frontends.onnx import load_onnx
from cuvil.verify.runner import target_unavailable

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
ELEM = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.int8): TensorProto.INT8,
        np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
        np.dtype(np.float16): TensorProto.FLOAT16}
EXACT, STEP, FLOAT = "exact", "step", "float"
LSTM_ATOL = 1 / 255  # half a step of the 8-bit grid over [-1, 1], the rounding onnxruntime gives H


class Case:
    """One node: its inputs (fed, or constants when ``const``), attributes and the tolerance of its output."""

    def __init__(self, op: str, inputs: list[np.ndarray | None], kind: str, *, const: tuple[int, ...] = (),
                 outputs: int = 1, **attrs: Any) -> None:
        self.op, self.inputs, self.kind, self.const, self.outputs, self.attrs = op, inputs, kind, const, outputs, attrs

    def parts(self, name: str) -> tuple[onnx.NodeProto, list[onnx.ValueInfoProto], list[onnx.TensorProto],
                                        dict[str, np.ndarray], list[str]]:
        ins, vis, inits, feeds = [], [], [], {}
        for i, v in enumerate(self.inputs):
            if v is None:
                ins.append("")
                continue
            key = f"{name}_in{i}"
            ins.append(key)
            if i in self.const:
                inits.append(numpy_helper.from_array(v, key))
            else:
                vis.append(helper.make_tensor_value_info(key, ELEM[v.dtype], list(v.shape)))
                feeds[key] = v
        outs = [f"{name}_out{i}" for i in range(self.outputs)]
        node = helper.make_node(self.op, ins, outs, name=name, domain=MS, **self.attrs)
        return node, vis, inits, feeds, outs


def _model(cases: dict[str, Case]) -> tuple[onnx.ModelProto, dict[str, np.ndarray], dict[str, list[str]]]:
    nodes, vis, inits, feeds, outs = [], [], [], {}, {}
    for name, case in cases.items():
        n, v, i, f, o = case.parts(name)
        nodes.append(n)
        vis += v
        inits += i
        feeds.update(f)
        outs[name] = o
    graph = helper.make_graph(nodes, "contrib", vis, [onnx.ValueInfoProto(name=o) for os_ in outs.values() for o in os_],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    return model, feeds, outs


RNG = np.random.default_rng(23)


def q8(dtype: type, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, size=shape).astype(dtype)


def every8(dtype: type, *shape: int) -> np.ndarray:
    """Every value of the type (repeated and shuffled into ``shape``, a multiple of 256 elements)."""
    v = np.arange(256, dtype=np.uint8).view(dtype)
    return RNG.permutation(np.resize(v, int(np.prod(shape)))).reshape(shape)


def f32(*v: float) -> np.ndarray:
    return np.array(v[0] if len(v) == 1 else v, np.float32)


def zp(dtype: type, v: int | list[int]) -> np.ndarray:
    return np.array(v, dtype)


def _lstm_case(direction: str, per_channel: bool, wdt: type, *, initial: bool, const_weights: bool = True) -> Case:
    nd = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hid = 5, 2, 6, 8
    w = q8(wdt, nd, inp, 4 * hid)
    r = q8(wdt, nd, hid, 4 * hid)
    sshape = (nd, 4 * hid) if per_channel else (nd,)
    ws = (RNG.uniform(0.5, 1.5, sshape) / 127 / np.sqrt(inp)).astype(np.float32)
    rs = (RNG.uniform(0.5, 1.5, sshape) / 127 / np.sqrt(hid)).astype(np.float32)
    # onnxruntime's kernel takes int8 weights with zero points 0 only, uint8 ones with one zero point
    wz = np.zeros(sshape, wdt) if wdt is np.int8 else np.full(sshape, 128, np.uint8)
    rz = np.zeros(sshape, wdt) if wdt is np.int8 else np.full(sshape, 120, np.uint8)
    b = (RNG.standard_normal((nd, 8 * hid)) * 0.2).astype(np.float32)
    x = RNG.standard_normal((seq, batch, inp)).astype(np.float32)
    h0 = (RNG.standard_normal((nd, batch, hid)) * 0.5).astype(np.float32) if initial else None
    c0 = (RNG.standard_normal((nd, batch, hid)) * 0.5).astype(np.float32) if initial else None
    const = (1, 2, 3, 8, 9, 10, 11) if const_weights else (3,)
    return Case("DynamicQuantizeLSTM", [x, w, r, b, None, h0, c0, None, ws, wz, rs, rz], "lstm", const=const,
                outputs=3, hidden_size=hid, **({"direction": direction} if direction != "forward" else {}))


def _cases() -> dict[str, Case]:
    u8, i8 = np.uint8, np.int8
    c: dict[str, Case] = {}
    for op in ("QLinearAdd", "QLinearMul"):
        mul = op == "QLinearMul"
        cs = 0.9 if mul else 0.045
        c[f"{op}_u8"] = Case(op, [q8(u8, 2, 3, 16, 16), f32(0.021), zp(u8, 131), q8(u8, 2, 3, 16, 16), f32(0.033),
                                  zp(u8, 120), f32(cs), zp(u8, 125)], STEP, const=(1, 2, 4, 5, 6, 7))
        c[f"{op}_i8_broadcast"] = Case(op, [q8(i8, 2, 3, 16, 16), f32(0.02), zp(i8, -3), q8(i8, 1, 3, 1, 16), f32(0.05),
                                            zp(i8, 4), f32(cs), zp(i8, 2)], STEP, const=(1, 2, 4, 5, 6, 7))
        c[f"{op}_no_output_zero_point"] = Case(op, [q8(i8, 4, 16), f32(0.02), zp(i8, 1), q8(i8, 16), f32(0.03),
                                                    zp(i8, 0), f32(cs)], STEP)
    for dt, name in ((u8, "u8"), (i8, "i8")):
        z = 128 if dt is u8 else 0
        c[f"QLinearSigmoid_{name}"] = Case("QLinearSigmoid", [every8(dt, 4, 128), f32(0.05), zp(dt, z - 3),
                                                              f32(1 / 256), zp(dt, 0 if dt is u8 else -128)],
                                           STEP, const=(1, 2, 3, 4))
        c[f"QLinearLeakyRelu_{name}"] = Case("QLinearLeakyRelu", [every8(dt, 2, 256), f32(0.07), zp(dt, z + 5),
                                                                  f32(0.05), zp(dt, z - 20)], EXACT, alpha=0.1)
    # int8 with the output zero point absent (0): the negative results stay representable
    c["QLinearLeakyRelu_default_alpha"] = Case("QLinearLeakyRelu", [every8(i8, 256), f32(0.2), zp(i8, 10),
                                                                    f32(0.01), None], EXACT)
    for dt, name in ((u8, "u8"), (i8, "i8")):
        z = 128 if dt is u8 else 0
        parts = [q8(dt, 2, 3, 4), f32(0.05), zp(dt, z + 3),   # the output's parameters: copied as they are
                 q8(dt, 2, 1, 4), f32(0.02), zp(dt, z - 10),
                 q8(dt, 2, 5, 4), f32(0.11), zp(dt, z)]
        c[f"QLinearConcat_{name}"] = Case("QLinearConcat", [f32(0.05), zp(dt, z + 3), *parts], EXACT,
                                          const=(0, 1, 3, 4, 6, 7, 9, 10), axis=1)
    c["QLinearGlobalAveragePool_u8"] = Case("QLinearGlobalAveragePool", [q8(u8, 2, 5, 6, 7), f32(0.03), zp(u8, 128),
                                                                         f32(0.011), zp(u8, 125)], STEP)
    c["QLinearGlobalAveragePool_i8_channels_last"] = Case(
        "QLinearGlobalAveragePool", [q8(i8, 2, 6, 7, 5), f32(0.03), zp(i8, 1), f32(0.007), zp(i8, -2)], STEP,
        channels_last=1)
    c["QLinearAveragePool_u8_pads"] = Case(
        "QLinearAveragePool", [q8(u8, 2, 3, 9, 9), f32(0.04), zp(u8, 128), f32(0.03), zp(u8, 126)], STEP,
        kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c["QLinearAveragePool_i8_channels_last_ceil"] = Case(
        "QLinearAveragePool", [q8(i8, 1, 8, 8, 4), f32(0.04), zp(i8, 0), f32(0.02), zp(i8, 3)], STEP,
        kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1, pads=[0, 1, 0, 1], channels_last=1)
    c["QLinearAveragePool_i8_count_include_pad"] = Case(
        "QLinearAveragePool", [q8(i8, 1, 4, 8, 8), f32(0.04), zp(i8, 0), f32(0.02), zp(i8, 3)], STEP,
        kernel_shape=[3, 3], strides=[2, 2], count_include_pad=1, pads=[1, 1, 1, 1])
    c["QLinearAveragePool_u8_1d"] = Case(
        "QLinearAveragePool", [q8(u8, 2, 4, 11), f32(0.04), zp(u8, 128), f32(0.03), zp(u8, 126)], STEP,
        kernel_shape=[3], auto_pad="SAME_UPPER")
    c["QLinearSoftmax_u8_opset13"] = Case("QLinearSoftmax", [q8(u8, 3, 4, 10), f32(0.08), zp(u8, 128), f32(1 / 256),
                                                             zp(u8, 0)], STEP, const=(1, 2, 3, 4), opset=13, axis=1)
    c["QLinearSoftmax_i8_opset12"] = Case("QLinearSoftmax", [q8(i8, 3, 4, 5), f32(0.06), zp(i8, 0), f32(1 / 256),
                                                             zp(i8, -128)], STEP, const=(1, 2, 3, 4), opset=12, axis=1)
    a_u, b_i = q8(u8, 5, 12), q8(i8, 12, 7)
    c["QGemm_u8_requant_transB_bias"] = Case(
        "QGemm", [a_u, f32(0.02), zp(u8, 130), np.ascontiguousarray(b_i.T), f32(0.01), zp(i8, 0),
                  RNG.integers(-3000, 3000, 7).astype(np.int32), f32(0.8), zp(u8, 128)], EXACT,
        const=(1, 2, 3, 4, 5, 6, 7, 8), transB=1)
    c["QGemm_i8_float_alpha_per_column"] = Case(
        "QGemm", [q8(i8, 12, 5), f32(0.02), zp(i8, 3), b_i, (RNG.uniform(0.005, 0.02, 7)).astype(np.float32),
                  np.zeros(7, i8), RNG.integers(-3000, 3000, (1, 7)).astype(np.int32)], FLOAT,
        const=(1, 2, 3, 4, 5, 6), transA=1, alpha=0.5)
    c["QGemm_u8_full_bias"] = Case(
        "QGemm", [a_u, f32(0.02), zp(u8, 130), q8(u8, 12, 7), f32(0.01), zp(u8, 127),
                  RNG.integers(-3000, 3000, (5, 7)).astype(np.int32), f32(0.9), zp(u8, 120)], EXACT,
        const=(3, 4, 5, 6), alpha=1.25)
    c["MatMulIntegerToFloat_u8_per_column_bias"] = Case(
        "MatMulIntegerToFloat", [q8(u8, 2, 4, 12), q8(i8, 12, 7), f32(0.02),
                                 (RNG.uniform(0.005, 0.02, 7)).astype(np.float32), zp(u8, 129), None,
                                 RNG.standard_normal(7).astype(np.float32)], FLOAT, const=(1, 2, 3, 4, 6))
    c["MatMulIntegerToFloat_u8_no_zero_points"] = Case(
        "MatMulIntegerToFloat", [q8(u8, 6, 12), q8(u8, 12, 7), f32(0.02), f32(0.03)], FLOAT)
    c["DynamicQuantizeMatMul_i8_bias"] = Case(
        "DynamicQuantizeMatMul", [RNG.standard_normal((2, 5, 12)).astype(np.float32), q8(i8, 12, 7), f32(0.01), None,
                                  RNG.standard_normal(7).astype(np.float32)], FLOAT, const=(1, 2, 4))
    c["DynamicQuantizeMatMul_u8_zero_point_positive"] = Case(
        "DynamicQuantizeMatMul", [RNG.uniform(0.1, 3.0, (6, 12)).astype(np.float32), q8(u8, 12, 7), f32(0.01),
                                  zp(u8, 125)], FLOAT)
    c["DynamicQuantizeLSTM_forward_i8"] = _lstm_case("forward", False, np.int8, initial=False)
    c["DynamicQuantizeLSTM_bidirectional_per_channel_i8_initial"] = _lstm_case("bidirectional", True, np.int8,
                                                                               initial=True)
    c["DynamicQuantizeLSTM_reverse_u8_weights_as_inputs"] = _lstm_case("reverse", False, np.uint8, initial=True,
                                                                       const_weights=False)
    return c


CASES = _cases()


class Run:
    """One model of a group of cases, onnxruntime's outputs, and Cuvil's per target (each built once)."""

    def __init__(self, cases: dict[str, Case], cache: str) -> None:
        self.model, self.feeds, self.outs = _model(cases)
        self.names = [o.name for o in self.model.graph.output]
        sess = ort.InferenceSession(self.model.SerializeToString(), providers=["CPUExecutionProvider"])
        self.want = dict(zip(self.names, sess.run(self.names, self.feeds)))
        self.cache = cache
        self._got: dict[str, dict[str, np.ndarray]] = {}

    def got(self, target: str) -> dict[str, np.ndarray]:
        if target not in self._got:
            m = cuvil.compile(self.model, target, cache_dir=self.cache)
            self._got[target] = dict(zip(self.names, m(*[self.feeds[i.name] for i in self.model.graph.input])))
        return self._got[target]


def _group(case: str) -> str:
    return "lstm" if CASES[case].kind == "lstm" else "ops"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    cache = str(tmp_path_factory.mktemp("contrib-quant"))
    return {g: Run({k: c for k, c in CASES.items() if _group(k) == g}, cache) for g in ("ops", "lstm")}


def check(kind: str, got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    if kind == EXACT:
        np.testing.assert_array_equal(got, want, err_msg=what)
    elif kind == STEP:
        diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
        assert diff.max() <= 1, f"{what}: {int(np.count_nonzero(diff > 1))} values more than one step apart"
    elif kind == FLOAT:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()), err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=LSTM_ATOL, err_msg=what)


def _marks(target: str, case: str) -> list[Any]:
    """The unrolled LSTMs make a large C program, and wasm32 builds are slow: those are in the slow tier."""
    marks = [pytest.mark.slow] if target == "wasm32" or (target, _group(case)) == ("native", "lstm") else []
    why = target_unavailable(target)
    return [*marks, pytest.mark.skipif(why is not None, reason=f"{target}: {why}")]


PARAMS = [pytest.param(t, c, marks=_marks(t, c)) for t in ("ref", "native", "wasm32") for c in CASES
          if (t, _group(c)) != ("wasm32", "lstm")]


@pytest.mark.parametrize(("target", "case"), PARAMS)
def test_contrib_op_matches_onnxruntime(target: str, case: str, runs: dict[str, Run]) -> None:
    run = runs[_group(case)]
    got = run.got(target)
    for name in run.outs[case]:
        check(CASES[case].kind, got[name], run.want[name], name)


@pytest.mark.parametrize("target", ["ref", "native"])
def test_step_cases_mostly_agree_exactly(target: str, runs: dict[str, Run]) -> None:
    """The one-step differences are rare (values within a rounding of a tie), not systematic."""
    run, total, differ = runs["ops"], 0, 0
    got = run.got(target)
    for case, c in CASES.items():
        if c.kind == STEP:
            for name in run.outs[case]:
                total += run.want[name].size
                differ += int(np.count_nonzero(got[name] != run.want[name]))
    assert differ <= total * 0.01, f"{differ} of {total} 8-bit values differ by a step"


def test_dynamic_quantize_lstm_weights_fold_at_import() -> None:
    """Constant quantized weights become float constants in LSTM's layout: no dequantization at run time."""
    model, _, _ = _model({"l": CASES["DynamicQuantizeLSTM_bidirectional_per_channel_i8_initial"]})
    g = load_onnx(model)
    assert "transpose" not in {n.op for n in g.nodes}
    assert sum(n.op == "dynamic_quantize_linear" for n in g.nodes) == 1


def _one(op: str, inputs: list[np.ndarray | None], **attrs: Any) -> onnx.ModelProto:
    model, _, _ = _model({"n": Case(op, inputs, EXACT, **attrs)})
    return model


REFUSED: dict[str, tuple[Callable[[], onnx.ModelProto], type[CuvilError], str]] = {
    "per-channel-add-scale": (lambda: _one("QLinearAdd", [q8(np.uint8, 2, 3), f32(0.1, 0.2, 0.3), zp(np.uint8, 1),
                                                          q8(np.uint8, 2, 3), f32(0.1), zp(np.uint8, 1), f32(0.2),
                                                          zp(np.uint8, 1)]),
                              ModelError, "must be a scalar"),
    "mixed-types": (lambda: _one("QLinearMul", [q8(np.uint8, 3), f32(0.1), None, q8(np.int8, 3), f32(0.1), None,
                                                f32(0.2)]), ModelError, "must be u8"),
    "concat-triples": (lambda: _one("QLinearConcat", [f32(0.1), zp(np.uint8, 0), q8(np.uint8, 2), f32(0.1)], axis=0),
                       ModelError, "triples"),
    "concat-axis": (lambda: _one("QLinearConcat", [f32(0.1), zp(np.uint8, 0), q8(np.uint8, 2), f32(0.1),
                                                   zp(np.uint8, 0)]), ModelError, "'axis' is required"),
    "softmax-opset": (lambda: _one("QLinearSoftmax", [q8(np.uint8, 2, 3), f32(0.1), None, f32(1 / 256),
                                                      zp(np.uint8, 0)]), ModelError, "'opset'"),
    "qgemm-y-scale-alone": (lambda: _one("QGemm", [q8(np.uint8, 2, 3), f32(0.1), zp(np.uint8, 0), q8(np.int8, 3, 4),
                                                   f32(0.1), zp(np.int8, 0), None, f32(0.3)]),
                            ModelError, "y_scale and y_zero_point"),
    "pool-attribute": (lambda: _one("QLinearAveragePool", [q8(np.uint8, 1, 2, 4, 4), f32(0.1), None, f32(0.1), None],
                                    kernel_shape=[2, 2], dilations=[2, 2]), UnsupportedOpError, "dilations"),
    "lstm-layout": (lambda: _one("DynamicQuantizeLSTM", [np.zeros((2, 1, 3), np.float32), q8(np.int8, 1, 3, 8),
                                                         q8(np.int8, 1, 2, 8), None, None, None, None, None,
                                                         f32([0.1]), zp(np.int8, [0]), f32([0.1]), zp(np.int8, [0])],
                                 hidden_size=2, layout=1), UnsupportedOpError, "layout"),
    "lstm-scale-shape": (lambda: _one("DynamicQuantizeLSTM", [np.zeros((2, 1, 3), np.float32), q8(np.int8, 1, 3, 8),
                                                              q8(np.int8, 1, 2, 8), None, None, None, None, None,
                                                              f32(0.1, 0.2), zp(np.int8, [0, 0]), f32([0.1]),
                                                              zp(np.int8, [0])], hidden_size=2),
                         ModelError, "W_scale must be"),
    "f16-scale": (lambda: _one("MatMulIntegerToFloat", [q8(np.uint8, 2, 3), q8(np.int8, 3, 4),
                                                        np.array(0.1, np.float16), np.array(0.1, np.float16)]),
                  UnsupportedOpError, "float32 scales only"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_malformed_or_unsupported_is_refused_by_name(case: str) -> None:
    build, error, words = REFUSED[case]
    with pytest.raises(error, match=words):
        cuvil.compile(build(), "ref")


def test_average_pool_ceil_overhang_counts_as_onnx_average_pool() -> None:
    """With ``ceil_mode`` and ``count_include_pad``, a last window reaching past the padding divides by
    the elements it covers (padding included), as ONNX AveragePool (and onnxruntime's float kernel, and
    PyTorch) do; onnxruntime's QLinearAveragePool divides such windows by the whole kernel instead.
    The oracle: onnxruntime's AveragePool on the dequantized input, quantized with NumPy."""
    attrs = {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1, "count_include_pad": 1, "pads": [0, 1, 0, 1]}
    x = q8(np.int8, 1, 4, 8, 8)
    model, _, _ = _model({"p": Case("QLinearAveragePool", [x, f32(0.04), zp(np.int8, 0), f32(0.02), zp(np.int8, 3)],
                                    STEP, const=(1, 2, 3, 4), **attrs)})
    (got,) = cuvil.compile(model, "ref")(x)
    pool = helper.make_model(helper.make_graph(
        [helper.make_node("AveragePool", ["x"], ["y"], **attrs)], "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]), opset_imports=[helper.make_opsetid("", 17)])
    (avg,) = ort.InferenceSession(pool.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32) * np.float32(0.04)})
    want = np.clip(np.rint(avg / np.float32(0.02)) + 3, -128, 127).astype(np.int8)
    check(STEP, got, want, "QLinearAveragePool ceil_mode count_include_pad")


# whole models quantized by onnxruntime's tools (slow) ------------------------------------------------------------


def _torch_models() -> dict[str, tuple[Any, tuple[int, ...]]]:
    import torch

    class Cnn(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
            self.c3, self.fc = torch.nn.Conv2d(8, 8, 1), torch.nn.Linear(16, 10)

        def forward(self, x: Any) -> Any:
            a = torch.sigmoid(self.c1(x))
            b = torch.nn.functional.leaky_relu(self.c2(a), 0.1)
            c = a + b
            d = c * torch.sigmoid(self.c3(c))
            p = torch.nn.functional.avg_pool2d(torch.cat([d, c], 1), 2)
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(p, 1).flatten(1))

    class Encoder(torch.nn.Module):
        """One attention block: q, k and v read one input (one dynamic quantization feeds three products)."""

        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
            self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x: Any) -> Any:
            att = torch.softmax(torch.matmul(self.q(x), self.k(x).transpose(1, 2)) * 0.25, -1)
            h = x + torch.matmul(att, self.v(x))
            return h + self.down(torch.relu(self.up(h))) * torch.sigmoid(h)

    class Lstm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm, self.fc = torch.nn.LSTM(8, 16, bidirectional=True), torch.nn.Linear(32, 4)

        def forward(self, x: Any) -> Any:
            return self.fc(self.lstm(x)[0])

    torch.manual_seed(0)
    return {"cnn": (Cnn(), (2, 3, 8, 8)), "encoder": (Encoder(), (2, 6, 16)), "lstm": (Lstm(), (7, 2, 8))}


class _Reader:
    """Calibration data for quantize_static: a few seeded batches."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        rng = np.random.default_rng(5)
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _quantized(tmp: Any, name: str, how: str) -> tuple[str, tuple[int, ...]]:
    """The model ``name`` exported (TorchScript exporter, opset 17) and quantized ``how``: ``dynamic``,
    ``dynamic-optimized`` (then saved by onnxruntime's graph optimizer, which fuses the integer products
    into MatMulIntegerToFloat / DynamicQuantizeMatMul), ``static-u8`` or ``static-i8`` (QOperator)."""
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    module, shape = _torch_models()[name]
    src, dst = tmp / f"{name}.onnx", tmp / f"{name}-{how}.onnx"
    torch.onnx.export(module.eval(), (torch.zeros(shape),), str(src), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    if how.startswith("dynamic"):
        quantize_dynamic(str(src), str(dst))
    else:
        act = QuantType.QUInt8 if how == "static-u8" else QuantType.QInt8
        quantize_static(str(src), str(dst), _Reader(shape), quant_format=QuantFormat.QOperator, activation_type=act,
                        weight_type=QuantType.QInt8)
    if how == "dynamic-optimized":
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(tmp / f"{name}-{how}-saved.onnx")
        # only the fusions of quantized products: others write ops another importer owns (FusedMatMul)
        ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"],
                             disabled_optimizers=["MatmulTransposeFusion", "MatMulScaleFusion"])
        return opts.optimized_model_filepath, shape
    return str(dst), shape


_STATIC_CNN = {"QLinearSigmoid", "QLinearLeakyRelu", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool",
               "QLinearGlobalAveragePool", "QGemm"}
_STATIC_ENCODER = {"QLinearAdd", "QLinearMul", "QLinearSoftmax", "QLinearSigmoid"}
# (model, how it is quantized) -> the com.microsoft ops the quantized model must hold
QUANTIZED: dict[tuple[str, str], set[str]] = {
    ("cnn", "static-u8"): _STATIC_CNN,
    ("cnn", "static-i8"): _STATIC_CNN,
    ("cnn", "dynamic"): set(),  # ConvInteger, MatMulInteger: the standard domain
    ("cnn", "dynamic-optimized"): {"DynamicQuantizeMatMul"},
    ("encoder", "static-u8"): _STATIC_ENCODER,
    ("encoder", "static-i8"): _STATIC_ENCODER,
    ("encoder", "dynamic-optimized"): {"MatMulIntegerToFloat", "DynamicQuantizeMatMul"},
    ("lstm", "dynamic"): {"DynamicQuantizeLSTM"},
}
# The products and the 8-bit ops round as onnxruntime does (measured: equal, or 1e-7 apart), so the
# whole-model bound is the one real models are held to; the LSTM's hidden-state rounding (see the
# module docstring) carried through the recurrence and its classifier: relative L2 1e-2 (measured 2e-3).
MODEL_RTOL, MODEL_ATOL, LSTM_MODEL_REL_L2 = 1e-3, 1e-4, 1e-2


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], tuple[str, tuple[int, ...]]]:
    made: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = {}
    tmp = tmp_path_factory.mktemp("quantized")

    def get(name: str, how: str) -> tuple[str, tuple[int, ...]]:
        if (name, how) not in made:
            made[name, how] = _quantized(tmp, name, how)
        return made[name, how]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ref", "native"])
@pytest.mark.parametrize(("name", "how"), list(QUANTIZED))
def test_onnxruntime_quantized_model_matches_onnxruntime(name: str, how: str, target: str, quantized: Any,
                                                         tmp_path: Any) -> None:
    path, shape = quantized(name, how)
    found = {n.op_type for n in onnx.load(path).graph.node if n.domain == MS}
    assert found >= QUANTIZED[name, how], f"{name} {how}: onnxruntime wrote {sorted(found)}"
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    m = cuvil.compile(path, target, cache_dir=str(tmp_path))
    rng = np.random.default_rng(11)
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        (got,) = m(x)
        assert got.dtype == want.dtype and got.shape == want.shape
        if name == "lstm":
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            assert err <= LSTM_MODEL_REL_L2, f"relative L2 {err:.3g}"
        else:
            np.testing.assert_allclose(got, want, rtol=MODEL_RTOL, atol=MODEL_ATOL, err_msg=f"{name} {how}")

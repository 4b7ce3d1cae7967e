"""ONNX QDQ models quantized by onnxruntime's own tool compile on every C target, with their
products folded into integer kernels, and match onnxruntime within one quantization step.

onnxruntime is run twice: as the model is written (graph optimizations off: DequantizeLinear,
the float op, QuantizeLinear), which every build must match; and as deployed (its default
optimizations, which fuse the QDQ groups into its integer kernels), which builds must match on
CPUs with VNNI dot products.  On CPUs without them onnxruntime's u8s8 kernels multiply with
vpmaddubsw, whose int16 pair sums saturate, and its outputs move up to tens of steps away from
the model's own semantics (its documentation's "saturation" note); there the deployed session is
not a reference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.c.toolchain import cpu_flags
from cuvil.frontends.onnx import load_onnx
from cuvil.passes import PassManager, default_pipeline

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")


class _CNN(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        return self.fc(x.flatten(1))


class _MLP(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(32, 64)
        self.l2 = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


SHAPES = {"cnn": (2, 3, 16, 16), "mlp": (4, 32)}


class _Reader(quantization.CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, shape: tuple[int, ...]) -> None:
        rng = np.random.default_rng(1)
        self._it = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """QDQ models: {cnn, mlp} x {per-channel, per-tensor weights} x {uint8, int8 activations}."""
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("qdq")
    out: dict[str, Path] = {}
    for name, net in (("cnn", _CNN()), ("mlp", _MLP())):
        fp32 = d / f"{name}.onnx"
        torch.onnx.export(net.eval(), torch.zeros(SHAPES[name]), str(fp32), input_names=["x"], output_names=["y"],
                          dynamo=False, opset_version=17)
        for per_channel in (True, False):
            for act in (quantization.QuantType.QUInt8, quantization.QuantType.QInt8):
                key = f"{name}-{'pc' if per_channel else 'pt'}-{'u8' if act == quantization.QuantType.QUInt8 else 's8'}"
                path = d / f"{key}.onnx"
                quantization.quantize_static(str(fp32), str(path), _Reader(SHAPES[name]),
                                             quant_format=quantization.QuantFormat.QDQ, per_channel=per_channel,
                                             activation_type=act, weight_type=quantization.QuantType.QInt8)
                out[key] = path
    return out


def _check(path: Path, target: str, cache_dir: str) -> None:
    import onnx

    model = onnx.load(str(path))
    x = np.random.default_rng(5).standard_normal(SHAPES[path.name.split("-")[0]]).astype(np.float32) * 1.5
    got = cuvil.compile(str(path), target=target, cache_dir=cache_dir)(x)[0]
    # the output is dequantized by the model's last node: one step is its scale
    last = next(n for n in model.graph.node if n.output[0] == "y")
    assert last.op_type == "DequantizeLinear"
    scale = float(next(onnx.numpy_helper.to_array(i) for i in model.graph.initializer if i.name == last.input[1]))
    for optimized in (False, True) if _VNNI else (False,):
        opts = ort.SessionOptions()
        if not optimized:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        want = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        steps = np.abs(got - want) / scale
        assert steps.max() <= 1.0 + 1e-6, (f"{path.name} on {target}: {steps.max():.2f} quantization steps off "
                                           f"onnxruntime ({'optimized' if optimized else 'as written'})")


_VNNI = bool(cpu_flags() & {"avx512_vnni", "avx_vnni"})


KEYS = [f"{m}-{w}-{a}" for m in SHAPES for w in ("pc", "pt") for a in ("u8", "s8")]


@pytest.mark.parametrize("key", KEYS)
def test_products_fold_into_integer_kernels(models: dict[str, Path], key: str) -> None:
    graph = PassManager(default_pipeline("native")).run(load_onnx(str(models[key])))
    ops = {n.op for n in graph.nodes}
    assert ops & {"qlinear_conv", "qlinear_matmul"} and not ops & {"conv", "gemm", "matmul"}, ops


@pytest.mark.parametrize("key", KEYS)
def test_native_matches_onnxruntime(models: dict[str, Path], key: str, tmp_path: Path) -> None:
    _check(models[key], "native", str(tmp_path))


@pytest.mark.parametrize("key", ["cnn-pc-s8", "mlp-pt-u8"])
def test_generic_matches_onnxruntime(models: dict[str, Path], key: str, tmp_path: Path) -> None:
    _check(models[key], "generic", str(tmp_path))


@pytest.mark.slow  # the first wasm32 build in a fresh cache compiles zig's C libraries
def test_wasm32_matches_onnxruntime(models: dict[str, Path], tmp_path: Path) -> None:
    _check(models["cnn-pc-s8"], "wasm32", str(tmp_path))
    _check(models["mlp-pt-u8"], "wasm32", str(tmp_path))


@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamically_quantized_models_match_onnxruntime(per_channel: bool, tmp_path: Path) -> None:
    """onnxruntime's ``quantize_dynamic`` (DynamicQuantizeLinear and MatMulInteger): activations are
    quantized at run time from their own ranges, so there is no output scale to count steps in; the
    result is compared, to float32 rounding, with ONNX's reference evaluator, and with onnxruntime on
    VNNI CPUs (without VNNI its u8s8 MatMulInteger saturates, optimized or not: 0.07 off here)."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    torch.manual_seed(0)
    fp32, path = tmp_path / "mlp.onnx", tmp_path / "mlp-dyn.onnx"
    torch.onnx.export(_MLP().eval(), torch.zeros(SHAPES["mlp"]), str(fp32), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    quantization.quantize_dynamic(str(fp32), str(path), per_channel=per_channel,
                                  weight_type=quantization.QuantType.QInt8)
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops, ops
    x = np.random.default_rng(5).standard_normal(SHAPES["mlp"]).astype(np.float32) * 1.5
    wants = {"onnx.reference": ReferenceEvaluator(model).run(None, {"x": x})[0]}
    if _VNNI:
        wants["onnxruntime"] = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for target in ("ref", "native"):
        got = cuvil.compile(str(path), target=target, cache_dir=str(tmp_path))(x)[0]
        for who, want in wants.items():
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()),
                                       err_msg=f"{target} against {who}")

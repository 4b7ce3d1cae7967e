"""int8, fp16 and bf16 accuracy on the model-test networks (tests/support/zoo/networks.py), against their float32 builds.

What issue 7 asks of each reduced build, measured here on native builds:

1. int8, the CNNs (ResNet-18, MobileNetV2): top-1 agreement with float32 at least 99 %;
2. int8, the transformer encoder: output SNR at least 30 dB;
3. fp16 and bf16: outputs within relative L2 1e-2 of float32, and bf16 no further from float32
   than PyTorch's own bfloat16 model (``model.to(torch.bfloat16)``) on the same inputs.

The int8 builds are calibrated on 128 examples drawn from the same distribution as the
test inputs (never the test inputs themselves).  For the CNNs that distribution is
labelled: smooth per-class prototype images plus white noise.  Each CNN is the zoo's
architecture with a 10-class head, trained on that task here (Adam, label smoothing 0.1, a
30 or 100 steps of 32 images; seconds), so its batch-norm statistics match its data and its
features separate the classes, as a deployed model's do.  The float32 model must classify
held-out images (asserted): agreement then means something.  The networks run at 64x64,
which keeps every layer of the architectures and the test within seconds of compute.

Why trained: untrained weights measure the wrong thing both ways.  With the zoo's random
weights and a head fitted by ridge regression, ResNet-18's features vary across inputs by 5.5 %
of their norm, so the fitted head reads a small difference of large terms and multiplies the
type's rounding about five times: bf16 is 0.016 off there (PyTorch's bf16 model: 0.026), fp16
4e-4.  With batch-norm statistics set from data instead, the random networks turn chaotic: an
input rounded to bf16 alone moves ResNet-18's logits 0.007, every op's result rounded 0.026.
Trained, on the 32 test images: ResNet-18 in bf16 is 0.0024 off and MobileNetV2 0.0051
(PyTorch's bf16 models: 0.0030 and 0.0075); in fp16 3e-4 and 7e-4.  Training matters to
MobileNetV2: stopped at 60 steps (float32 accuracy 99.3 %) its bf16 build is 0.0086 off and int8
agrees on 99.3 % of the test images; at 60 steps with a learning rate of 2e-3 (98.8 %), bf16 is
0.017 off (PyTorch's: 0.024).  At 100 steps (100 %), the figures above.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuvil
from cuvil.metrics import relative_l2, snr_db

torch = pytest.importorskip("torch")

from tests.support.emulated import emulated, simde_include  # noqa: E402
from tests.support.zoo.networks import mobilenet_v2, resnet18, transformer_encoder  # noqa: E402

pytestmark = pytest.mark.slow

CLASSES = 10
CALIBRATION = 128  # examples, as issue 7 states
TEST_IMAGES = 300
MIN_TOP1_AGREEMENT = 0.99
MIN_SNR_DB = 30.0
MAX_REDUCED_REL_L2 = 1e-2
REDUCED_SAMPLES = 32  # test inputs the fp16/bf16 builds are compared on
AVX512_IMAGES = 32  # test images the emulated x86_avx512 int8 builds run (as the reduced builds)


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("build-cache"))


def _in_batches(model: Any, x: np.ndarray, batch: int = 50) -> np.ndarray:
    return np.concatenate([model(x[i:i + batch])[0] for i in range(0, len(x), batch)])


# CNNs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Classifier:
    """A CNN trained for 10 classes, exported once, its float32 build and its labelled data."""

    name: str
    module: Any  # the trained torch.nn.Module
    program: Any  # torch.export.ExportedProgram, batch dim symbolic
    fp32: Any  # the native float32 build
    calibration: list[tuple[np.ndarray]]  # 4 batches of 32 examples
    test: np.ndarray
    labels: np.ndarray


def _prototypes(size: int, seed: int) -> np.ndarray:
    """One smooth image per class: random 4x4 blocks per channel, upsampled to ``size``."""
    rng = np.random.default_rng(seed)
    return np.kron(rng.standard_normal((CLASSES, 3, 4, 4)), np.ones((size // 4, size // 4)))


def _clusters(protos: np.ndarray, noise: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    x = protos[labels] + noise * rng.standard_normal((n, *protos.shape[1:]))
    return x.astype(np.float32), labels


NOISE = 0.8  # of the clusters, against prototypes of unit variance
SIZE = 64
TRAINING = {  # model: (builder, Adam steps of 32 images, learning rate)
    "resnet18": (lambda: resnet18(num_classes=CLASSES), 30, 3e-3),
    "mobilenet_v2": (lambda: mobilenet_v2(num_classes=CLASSES), 100, 3e-3),
}


def _train(model: Any, protos: np.ndarray, steps: int, lr: float) -> Any:
    """``model`` trained on fresh labelled clusters, then in eval mode."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        x, y = _clusters(protos, NOISE, 32, seed=100 + step)
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y),
                                                 label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="module", params=sorted(TRAINING))
def classifier(request: pytest.FixtureRequest, build_cache: str) -> Classifier:
    build, steps, lr = TRAINING[request.param]
    protos = _prototypes(SIZE, seed=1)
    model = _train(build(), protos, steps, lr)
    dyn = {"x": {0: torch.export.Dim("batch", min=1, max=512)}}
    program = torch.export.export(model, (torch.zeros(2, 3, SIZE, SIZE),), dynamic_shapes=dyn)
    calibration = [(c,) for c in np.split(_clusters(protos, NOISE, CALIBRATION, seed=3)[0], 4)]
    test, labels = _clusters(protos, NOISE, TEST_IMAGES, seed=4)
    fp32 = cuvil.compile(program, "native", cache_dir=build_cache)
    return Classifier(request.param, model, program, fp32, calibration, test, labels)


def test_cnn_int8_top1_agrees_with_fp32(classifier: Classifier, build_cache: str) -> None:
    q8 = cuvil.compile(classifier.program, "native", cache_dir=build_cache, quant_dtype="int8",
                       calibration_dataset=classifier.calibration)
    assert q8.graph is not None and any(n.op.startswith("qlinear_") for n in q8.graph.nodes)  # integer kernels
    assert q8.info.precision is not None and q8.info.precision["quantization"]["examples"] == CALIBRATION
    fp = np.argmax(_in_batches(classifier.fp32, classifier.test), axis=1)
    i8 = np.argmax(_in_batches(q8, classifier.test), axis=1)
    assert np.mean(fp == classifier.labels) > 0.9, "the float32 model does not classify: agreement means nothing"
    agreement = float(np.mean(fp == i8))
    assert agreement >= MIN_TOP1_AGREEMENT, f"{classifier.name}: int8 top-1 agreement {agreement:.3f}"


@pytest.mark.skipif(simde_include() is None, reason="simde-py (SIMDe's headers) is not installed")
@pytest.mark.parametrize("classifier", ["mobilenet_v2"], indirect=True)  # pointwise, depthwise and full convs
def test_cnn_int8_for_avx512_vnni_and_int16_pairs_agree(classifier: Classifier, build_cache: str,
                                                        tmp_path: Path) -> None:
    """The x86_avx512 int8 build, its base library (int16 pairs) and its VNNI one, run under
    emulation (tests/support/emulated.py): the same bytes out of both, and top-1 agreement with
    float32 as for the native build."""
    q8 = cuvil.compile(classifier.program, "x86_avx512", cache_dir=build_cache, quant_dtype="int8",
                       calibration_dataset=classifier.calibration)
    x = classifier.test[:AVX512_IMAGES]
    base = _in_batches(emulated(q8, tmp_path / "base"), x)
    vnni = _in_batches(emulated(q8, tmp_path / "vnni", ["avx512_vnni"]), x)
    assert np.array_equal(base, vnni)
    fp = np.argmax(_in_batches(classifier.fp32, x), axis=1)
    agreement = float(np.mean(fp == np.argmax(vnni, axis=1)))
    assert agreement >= MIN_TOP1_AGREEMENT, f"{classifier.name}: x86_avx512 int8 top-1 agreement {agreement:.3f}"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cnn_reduced_precision_within_1e_2(classifier: Classifier, precision: str, build_cache: str) -> None:
    m = cuvil.compile(classifier.program, "native", cache_dir=build_cache, precision=precision,
                      calibration_dataset=classifier.calibration)
    x = classifier.test[:REDUCED_SAMPLES]
    want = _in_batches(classifier.fp32, x)
    err = relative_l2(_in_batches(m, x), want)
    assert 0.0 < err <= MAX_REDUCED_REL_L2, f"{classifier.name} {precision}: relative L2 {err:.3g}"
    if precision == "bf16":  # no worse than the framework's own bf16 model
        with torch.no_grad():
            theirs = copy.deepcopy(classifier.module).to(torch.bfloat16)(torch.from_numpy(x).to(torch.bfloat16))
        torch_err = relative_l2(theirs.float().numpy(), want)
        assert err <= torch_err, f"{classifier.name} bf16: relative L2 {err:.3g}, PyTorch's bf16 {torch_err:.3g}"


# transformer encoder -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoder:
    program: Any
    fp32: Any
    calibration: list[tuple[np.ndarray]]
    test: list[np.ndarray]


@pytest.fixture(scope="module")
def encoder(build_cache: str) -> Encoder:
    """The zoo's transformer encoder (vocabulary 100, sequence 16); tokens uniform over the vocabulary."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 100, (CALIBRATION + 64, 1, 16))
    program = torch.export.export(transformer_encoder(), (torch.zeros(1, 16, dtype=torch.int64),))
    fp32 = cuvil.compile(program, "native", cache_dir=build_cache)
    return Encoder(program, fp32, [(t,) for t in tokens[:CALIBRATION]], list(tokens[CALIBRATION:]))


def _outputs(model: Any, tokens: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([model(t)[0] for t in tokens])


def test_encoder_int8_output_snr(encoder: Encoder, build_cache: str) -> None:
    q8 = cuvil.compile(encoder.program, "native", cache_dir=build_cache, quant_dtype="int8",
                       calibration_dataset=encoder.calibration)
    assert q8.graph is not None and any(n.op.startswith("qlinear_") for n in q8.graph.nodes)
    snr = snr_db(_outputs(q8, encoder.test), _outputs(encoder.fp32, encoder.test))
    assert snr >= MIN_SNR_DB, f"int8 output SNR {snr:.1f} dB"


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_encoder_reduced_precision_within_1e_2(encoder: Encoder, precision: str, build_cache: str) -> None:
    m = cuvil.compile(encoder.program, "native", cache_dir=build_cache, precision=precision,
                      calibration_dataset=encoder.calibration)
    tokens = encoder.test[:REDUCED_SAMPLES]
    err = relative_l2(_outputs(m, tokens), _outputs(encoder.fp32, tokens))
    assert 0.0 < err <= MAX_REDUCED_REL_L2, f"{precision}: relative L2 {err:.3g}"

"""The x86_avx512 kernels, VNNI and BF16 paths included, run under emulation (``emulated.py``) on
CPUs without AVX-512: int8 bit for bit against the reference, float within the targets' tolerance,
and free of out-of-bounds accesses under AddressSanitizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.c.toolchain import TARGET_VARIANTS
from cuvil.metrics import relative_l2
from tests.support.emulated import emulated, simde_include
from tests.support.int8_conv_graph import conv_graph
from tests.support.sanitizers import assert_clean_under_sanitizers

# every test builds kernel graphs against SIMDe's emulated intrinsics, which compile and run many
# times slower than the real instructions (20 to 60 s each): the slow tier
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(simde_include() is None, reason="simde-py (SIMDe's headers) is not installed")]

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"
# the CPU features each variant library of x86_avx512 is built for (model.avx512vnni.so, ...)
FEATURES = {v.name: tuple(sorted(v.features)) for v in TARGET_VARIANTS["x86_avx512"]}


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One build cache for the module's x86_avx512 compiles: the target's kernel library is built once."""
    return str(tmp_path_factory.mktemp("avx512-cache"))


@pytest.mark.parametrize("features", [(), FEATURES["avx512vnni"]], ids=["model.so", "model.avx512vnni.so"])
def test_int8_kernels_match_the_reference_bit_for_bit(features: tuple[str, ...], build_cache: str,
                                                      tmp_path: Path) -> None:
    graph, inputs = conv_graph()
    want = cuvil.compile(graph, "ref").run(inputs)
    m = cuvil.compile(graph, "x86_avx512", passes="", cache_dir=build_cache)
    got = emulated(m, tmp_path / "emu", features).run(inputs)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w), name


@pytest.mark.parametrize("precision,features,tol", [
    ("fp32", (), 1e-5),
    ("fp16", (), 1e-2),
    ("bf16", (), 1e-2),
    ("bf16", FEATURES["avx512bf16"], 1e-2),
], ids=["fp32", "fp16", "bf16-widened", "bf16-dot"])
def test_float_kernels_match_the_reference(precision: str, features: tuple[str, ...], tol: float,
                                           build_cache: str, tmp_path: Path) -> None:
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = cuvil.compile(str(EXAMPLE), "ref")(x)[0]
    m = cuvil.compile(str(EXAMPLE), "x86_avx512", precision=precision, cache_dir=build_cache)
    got = emulated(m, tmp_path / "emu", features)(x)[0]
    assert got.shape == want.shape and relative_l2(got, want) <= tol


_SANITIZED_CHILD = """
import sys
from pathlib import Path
import cuvil
from cuvil.backends.c import Build, CExecutor
from cuvil.runtime.compiled import CompiledModel
from tests.support.emulated import build_emulated
from tests.support.int8_conv_graph import run_twice_against_the_reference

def build(graph):
    work = Path(sys.argv[1])
    m = cuvil.compile(graph, "x86_avx512", passes="", cache_dir=sys.argv[2])
    info = m.build_info
    build_emulated(info.source, work / "model.so", ["avx512_vnni"], sanitize=True)  # as model.avx512vnni.so
    executor = CExecutor(Build(info.folder, True, 0.0), {}, library=work / "model.so", num_threads=2)
    return CompiledModel(m.signature, executor, m.target, m.graph, m.info)

run_twice_against_the_reference(build)
"""


@pytest.mark.slow
def test_int8_vnni_kernels_are_clean_under_asan_and_ubsan(build_cache: str, tmp_path: Path) -> None:
    """The AVX-512 int8 kernels' masked row tails and VNNI panels under AddressSanitizer and UBSan,
    on two threads (the emulation's masked loads and stores touch enabled lanes only, as the
    instructions do, so an access past a buffer is the kernel's)."""
    assert_clean_under_sanitizers(_SANITIZED_CHILD, str(tmp_path), build_cache)

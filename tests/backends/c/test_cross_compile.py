"""Building for a CPU other than this one: a C target whose features this CPU lacks is built and can
be saved, is not loaded, and running it says why."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.errors import CuvilError

EXAMPLE = Path(__file__).resolve().parents[3] / "cuvil" / "examples" / "tiny_cnn.onnx"


@pytest.fixture
def no_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU, as Cuvil sees it, has SSE2 but not AVX2 (so x86_avx2 is a build for another CPU)."""
    monkeypatch.setattr("cuvil.backends.c.toolchain.cpu_flags", lambda: frozenset({"sse", "sse2"}))


def test_a_target_this_cpu_lacks_is_built_saved_and_refused_at_run(no_avx2: None, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cuvil"):
        m = cuvil.compile(str(EXAMPLE), target="x86_avx2", cache_dir=str(tmp_path / "cache"))
    assert any("x86_avx2: built, not loaded: this CPU lacks avx2, f16c, fma" in r.getMessage() for r in caplog.records)
    info = m.build_info
    assert info is not None and info.num_threads is None and info.library.is_file()
    with pytest.raises(CuvilError, match="cannot run here: this CPU lacks avx2, f16c, fma"):
        m(np.zeros((1, 3, 32, 32), np.float32))
    folder = m.save(tmp_path / "art")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["target"] == "x86_avx2" and "-mavx2" in meta["rebuild"]
    assert (folder / "model.so").read_bytes() == info.library.read_bytes()


def test_a_saved_cross_build_runs_where_the_cpu_has_the_features(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The artifact built while the CPU looked like it lacked AVX2 loads and runs as a native build of
    the same target does (on a CPU that has them)."""
    from cuvil.backends.c.toolchain import cpu_flags

    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("this CPU cannot run x86_avx2 code")
    with monkeypatch.context() as mp:
        mp.setattr("cuvil.backends.c.toolchain.cpu_flags", lambda: frozenset({"sse2"}))
        folder = cuvil.compile(str(EXAMPLE), target="x86_avx2", cache_dir=str(tmp_path / "c1")).save(tmp_path / "a")
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    want = cuvil.compile(str(EXAMPLE), target="x86_avx2", cache_dir=str(tmp_path / "c2"))(x)[0]
    np.testing.assert_array_equal(cuvil.load(folder)(x)[0], want)


def test_int8_for_another_cpu_calibrates_here(no_avx2: None, tmp_path: Path) -> None:
    """Calibration and the accuracy report run on a native build; the int8 build is for the target
    (x86_avx2: 7-bit weights by default, as for its byte kernels)."""
    rng = np.random.default_rng(3)
    samples = [(rng.random((1, 3, 32, 32), dtype=np.float32),) for _ in range(64)]
    m = cuvil.compile(str(EXAMPLE), target="x86_avx2", cache_dir=str(tmp_path / "cache"), quant_dtype="int8",
                      calibration_dataset=samples)
    q = m.info.precision["quantization"]
    assert q["reduce_range"] is True and m.build_info is not None and m.build_info.num_threads is None
    with pytest.raises(CuvilError, match="cannot run here"):
        m(samples[0][0])

"""x86_avx512's variant libraries (``toolchain.TARGET_VARIANTS``): an int8 model's build also holds a
library with AVX-512 VNNI, a bf16 model's one with AVX512_BF16, a float32 model's neither; the
variant holds the instructions and the base does not; a CPU with the features loads the variant,
from the build and from a saved artifact, and meta.json's variants are checked.  The variants'
kernels themselves run under emulation in test_avx512_emulated.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.c.toolchain import TARGET_ISA, TARGET_VARIANTS, cpu_flags
from cuvil.errors import CuvilError, ModelError
from tests.support.int8_conv_graph import conv_graph

# every test builds the int8 convolution graph with its variant libraries (one compile each): 15 to 30 s
pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[3] / "cuvil" / "examples" / "tiny_cnn.onnx"
VARIANTS = {v.name: v for v in TARGET_VARIANTS["x86_avx512"]}


def _instructions(library: Path, *mnemonics: str) -> dict[str, int]:
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed")
    text = subprocess.run(["objdump", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    return {m: text.count(f"\t{m} ") for m in mnemonics}


def _int8(cache: Path) -> cuvil.CompiledModel:
    graph, _ = conv_graph()
    return cuvil.compile(graph, "x86_avx512", passes="", cache_dir=str(cache))


def test_int8_build_holds_a_vnni_library(tmp_path: Path) -> None:
    info = _int8(tmp_path).build_info
    assert info is not None
    names = sorted(p.name for p in info.folder.glob("*.so"))
    assert names == ["model.avx512vnni.so", "model.so"]
    assert _instructions(info.folder / "model.avx512vnni.so", "vpdpbusd")["vpdpbusd"] > 0
    assert _instructions(info.folder / "model.so", "vpdpbusd")["vpdpbusd"] == 0


def test_bf16_build_holds_a_bf16_dot_library_and_float32_none(tmp_path: Path) -> None:
    bf16 = cuvil.compile(str(EXAMPLE), "x86_avx512", precision="bf16", cache_dir=str(tmp_path)).build_info
    fp32 = cuvil.compile(str(EXAMPLE), "x86_avx512", cache_dir=str(tmp_path)).build_info
    assert bf16 is not None and fp32 is not None
    assert sorted(p.name for p in bf16.folder.glob("*.so")) == ["model.avx512bf16.so", "model.so"]
    assert _instructions(bf16.folder / "model.avx512bf16.so", "vdpbf16ps")["vdpbf16ps"] > 0
    assert _instructions(bf16.folder / "model.so", "vdpbf16ps")["vdpbf16ps"] == 0
    assert sorted(p.name for p in fp32.folder.glob("*.so")) == ["model.so"]


def _cpu_runs(*names: str) -> bool:
    need = set(TARGET_ISA["x86_avx512"]).union(*(VARIANTS[n].features for n in names))
    return need <= cpu_flags()


def test_a_cpu_with_vnni_loads_the_vnni_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Here the CPU Cuvil sees has AVX-512 and VNNI.  Where the real one has them too, the VNNI
    library runs, bit for bit as the reference; elsewhere loading it is refused by the library's own
    CPU check, which names the library that was picked."""
    graph, inputs = conv_graph()
    real = _cpu_runs("avx512vnni")
    monkeypatch.setattr("cuvil.backends.c.toolchain.cpu_flags",
                        lambda: frozenset(TARGET_ISA["x86_avx512"]) | VARIANTS["avx512vnni"].features)
    if not real:
        with pytest.raises(CuvilError, match=r"cannot load model\.avx512vnni\.so: .*avx512"):
            cuvil.compile(graph, "x86_avx512", passes="", cache_dir=str(tmp_path))
        return
    m = cuvil.compile(graph, "x86_avx512", passes="", cache_dir=str(tmp_path))
    assert m.build_info is not None and m.build_info.library.name == "model.avx512vnni.so"
    want = cuvil.compile(graph, "ref").run(inputs)
    got = m.run(inputs)
    assert all(np.array_equal(got[n], w) for n, w in want.items())


def test_an_artifact_loads_the_variant_the_cpu_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _int8(tmp_path / "cache").save(tmp_path / "art")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["files"]["library.avx512vnni"] == "model.avx512vnni.so"
    [variant] = meta["variants"]
    assert variant["needs"] == ["avx512_vnni"] and "-mavx512vnni" in variant["rebuild"]
    assert "-mavx512vnni" not in meta["rebuild"]
    if not _cpu_runs():
        with pytest.raises(CuvilError, match=r"cannot load model\.so: "):
            cuvil.load(folder)
    monkeypatch.setattr("cuvil.backends.c.toolchain.cpu_flags",
                        lambda: frozenset(TARGET_ISA["x86_avx512"]) | VARIANTS["avx512vnni"].features)
    if not _cpu_runs("avx512vnni"):
        with pytest.raises(CuvilError, match=r"cannot load model\.avx512vnni\.so: "):
            cuvil.load(folder)
    else:
        info = cuvil.load(folder).build_info
        assert info is not None and info.library == folder / "model.avx512vnni.so"


def test_meta_json_variants_are_checked(tmp_path: Path) -> None:
    folder = _int8(tmp_path / "cache").save(tmp_path / "art")
    meta = json.loads((folder / "meta.json").read_text())
    meta["variants"][0]["name"] = "../../evil"
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="variant libraries"):
        cuvil.load(folder)
    meta["variants"] = []
    (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="lists files"):
        cuvil.load(folder)

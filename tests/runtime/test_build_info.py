"""CompiledModel.build_info and loaded_weights: what a model's build made, for every target and
for a model loaded from an artifact."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.runtime.compiled import BuildInfo
from tests.support.paths import REPO

EXAMPLE = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def native(cache: str) -> cuvil.CompiledModel:
    return cuvil.compile(str(EXAMPLE), target="native", num_threads=2, cache_dir=cache)


def test_ref_has_no_build() -> None:
    m = cuvil.compile(str(EXAMPLE), target="ref")
    assert m.build_info is None and m.loaded_weights() is None


def test_native_build(native: cuvil.CompiledModel) -> None:
    b = native.build_info
    assert isinstance(b, BuildInfo) and b.target == "native"
    assert b.source == b.folder / "model.c" and b.source.is_file()
    assert b.library.name == "model.so" and b.library.is_file()
    assert b.weights_bytes == b.weights.stat().st_size > 0
    assert b.cached is False and b.num_threads == 2 and b.warnings == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.cached = True  # type: ignore[misc]
    # the line map: every node named there is a node of the graph, and its line mentions it
    lines = b.source.read_text(encoding="utf-8").splitlines()
    assert b.line_origins is not None and len(b.line_origins) == len(lines)
    conv = next(n for n in native.graph.walk() if n.op.endswith("conv"))  # type: ignore[union-attr]
    line = b.line_of(conv.name)
    assert line is not None and b.line_origins[line - 1] == conv.name
    assert all(b.line_origins[i] != conv.name for i in range(line - 1))
    assert b.line_of("no such node") is None


def test_loaded_weights_are_the_weights_file(native: cuvil.CompiledModel) -> None:
    b = native.build_info
    assert b is not None
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    native(x)
    assert native.loaded_weights() == b.weights.read_bytes()


def test_cache_hit_and_loaded_artifact(native: cuvil.CompiledModel, cache: str, tmp_path: Path) -> None:
    b = native.build_info
    assert b is not None
    again = cuvil.compile(str(EXAMPLE), target="native", cache_dir=cache)
    assert again.build_info is not None and again.build_info.cached and again.build_info.folder == b.folder
    loaded = cuvil.load(native.save(tmp_path / "art"))
    lb = loaded.build_info
    assert lb is not None and lb.folder == tmp_path / "art" and lb.line_origins is None and lb.cached
    assert lb.weights.read_bytes() == b.weights.read_bytes()
    assert loaded.loaded_weights() == b.weights.read_bytes()


def test_wasm32_build(wasm_cache: str) -> None:
    m = cuvil.compile(str(EXAMPLE), target="wasm32", cache_dir=wasm_cache)
    b = m.build_info
    assert b is not None and b.target == "wasm32" and b.library.name == "model.wasm" and b.library.is_file()
    assert b.num_threads == 1 and b.line_origins is not None and b.weights_bytes == b.weights.stat().st_size
    assert m.loaded_weights() is None  # the wasm instance's memory is not shown

"""The kernel library: the GEMM and the thread pool compiled once per compiler and flags, linked
into every model library; a model's own unit declares them (cuvil/backends/c/kernel_library.py)."""

from __future__ import annotations

import ctypes
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.backends.c import cache
from cuvil.backends.c.kernel_library import OBJECT, library_source
from cuvil.backends.c.library import NativeModel


def matmul_model(seed: int) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((48, 40)).astype(np.float32), "w")
    k = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "k")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"]),
             helper.make_node("Conv", ["img", "k"], ["c"], pads=[1, 1, 1, 1])]
    g = helper.make_graph(
        nodes, f"mm{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 48]),
         helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 40]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 4, 9, 9])],
        [w, k])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(autouse=True)
def _own_default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library the machine's default cache holds would serve these builds: give them an empty one."""
    monkeypatch.setattr(cache, "default_cache_dir", lambda: tmp_path / "default-cache")


def kernel_objects(root: Path) -> list[Path]:
    return sorted((root / "kernels").glob(f"*/*/{OBJECT}"))


def test_models_of_one_target_share_one_library_and_link_only_its_functions(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    rng = np.random.default_rng(0)
    for seed in (1, 2):
        m = cuvil.compile(matmul_model(seed), "native", cache_dir=str(root))
        x = rng.standard_normal((5, 48)).astype(np.float32)
        img = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
        want = cuvil.compile(matmul_model(seed), "ref")(x, img)
        got = m(x, img)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    assert len(kernel_objects(root)) == 1  # built by the first model, linked by the second
    # The model library exports its API and nothing of the library's (hidden symbols).
    so = m.build_info.library
    names = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True, check=True).stdout
    assert " cuvil_run" in names
    assert "cuvil_sgemm" not in names and "cuvil_parallel_for" not in names
    assert "cuvil_sgemm_ep" in subprocess.run(["nm", str(so)], capture_output=True, text=True, check=True).stdout
    ctypes.CDLL(str(so))  # loads: every library function it calls is linked in


def test_another_target_gets_its_own_library(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cuvil.compile(matmul_model(1), "native", cache_dir=str(root))
    cuvil.compile(matmul_model(1), "generic", cache_dir=str(root))
    assert len(kernel_objects(root)) == 2


def test_the_saved_source_still_compiles_alone_to_the_same_results(tmp_path: Path) -> None:
    """A saved artifact's model.c defines everything itself (CUVIL_KERNEL_LIBRARY unset): its
    rebuild command needs no library, and the code it builds computes bit for bit what the split
    build computes."""
    m = cuvil.compile(matmul_model(3), "native", cache_dir=str(tmp_path / "cache"))
    art = tmp_path / "art"
    m.save(art)
    rebuild = json.loads((art / "meta.json").read_text())["rebuild"]
    alone = rebuild.replace("-o model.so", "-o alone.so")
    subprocess.run(alone, shell=True, cwd=art, check=True, capture_output=True)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((33, 48)).astype(np.float32)  # past the small-product path
    img = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    split = NativeModel(art / "model.so", art / "weights.bin", 2).run([x, img])
    one = NativeModel(art / "alone.so", art / "weights.bin", 2).run([x, img])
    for a, b in zip(split, one, strict=True):
        assert np.array_equal(a, b)


def test_the_library_unit_is_the_runtime_headers_alone() -> None:
    src = library_source()
    assert src.splitlines()[:3] == ['#include "cuvil_rt.h"', '#include "cuvil_threads.h"', '#include "cuvil_gemm.h"']
    assert all(line.startswith('#include "cuvil_') for line in src.splitlines())


def test_a_fresh_cache_folder_links_the_library_the_default_cache_holds(tmp_path: Path) -> None:
    default = tmp_path / "default-cache"
    cuvil.compile(matmul_model(1), "native", cache_dir=str(default))
    cuvil.compile(matmul_model(2), "native", cache_dir=str(tmp_path / "fresh"))
    assert len(kernel_objects(default)) == 1
    assert kernel_objects(tmp_path / "fresh") == []  # found in the default cache, not built again

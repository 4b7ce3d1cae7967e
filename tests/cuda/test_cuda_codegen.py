"""The CUDA targets without running kernels: which ops have kernels (the completeness table), clear
errors for the others, generated source that nvcc compiles with warnings as errors, deterministic
output with a node-labelled line map, hostile names kept inert, the toolchain lookup, the ``hip``
target's saved source and build command, and ``cuda`` built and saved where no GPU can load it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
import cuvil.ops
from cuvil.backends.cuda import toolchain
from cuvil.backends.cuda.kernel import NOT_YET_SUPPORTED, device_ops, host_ops
from cuvil.backends.registry import get_backend
from cuvil.errors import UnsupportedOpError
from cuvil.ir.parser import parse_graph
from tests.cuda.support import GRAPHS, cuda_source, graph, nvcc, nvcc_check

EXAMPLES = Path(cuvil.__file__).parent / "examples"
needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc (CUDA toolkit) not found")


def test_every_declared_op_has_a_kernel_a_host_implementation_or_is_listed() -> None:
    declared = set(cuvil.ops.all_ops())
    device, host = device_ops(), host_ops()
    assert not device & host
    assert not (device | host) & NOT_YET_SUPPORTED, sorted((device | host) & NOT_YET_SUPPORTED)
    assert declared - device - host == NOT_YET_SUPPORTED, sorted((declared - device - host) ^ NOT_YET_SUPPORTED)
    assert {"fused_elementwise", "matmul", "gemm", "conv", "softmax", "layer_norm", "reduce_sum"} <= device
    assert {"reshape", "flatten", "squeeze", "unsqueeze", "shape"} <= host


def test_the_targets_are_in_the_backend_table() -> None:
    for name in ("cuda", "cuda:sm_80", "cuda:sm_90", "cuda-sim", "hip"):
        b = get_backend(name)
        assert b.kernel_ops() == device_ops() | host_ops()
        assert b.saves_artifacts
    assert get_backend("cuda-sim").cannot_run_here() is None


def test_an_op_without_a_kernel_is_one_error_naming_each_op_and_the_target(tmp_path: Path) -> None:
    g = parse_graph("""graph main(%x: f32[4, 5]) {
  %c = cumsum(%x, %a) : f32[4, 5]
  %h = hardmax(%c) : f32[4, 5]
  return %h
}
""".replace("%a)", "%ax)").replace("graph main(%x: f32[4, 5])", "graph main(%x: f32[4, 5], %ax: i64[])"))
    with pytest.raises(UnsupportedOpError) as info:
        cuvil.compile(g, target="cuda-sim", cache_dir=str(tmp_path))
    text = str(info.value)
    assert "cumsum" in text and "hardmax" in text and "cuda-sim" in text


def test_generated_source_is_deterministic_and_labelled(tmp_path: Path) -> None:
    a = cuda_source(graph("linalg"), tmp_path / "a").read_text()
    b = cuda_source(graph("linalg"), tmp_path / "b").read_text()
    assert a == b
    m = cuvil.compile(EXAMPLES / "tiny_cnn.onnx", target="hip", cache_dir=str(tmp_path / "c"))
    info = m.build_info
    lines = info.source.read_text().split("\n")  # type: ignore[union-attr]
    launches = [i for i, ln in enumerate(lines) if "CUVIL_LAUNCH(" in ln]
    assert launches and all(info.line_origins[i] for i in launches)  # type: ignore[index]
    assert {info.line_origins[i] for i in launches} >= {"conv1", "pool1", "gap"}  # type: ignore[index]


@needs_nvcc
@pytest.mark.parametrize("family", sorted(GRAPHS))
def test_generated_source_compiles_with_nvcc_warnings_as_errors(family: str, tmp_path: Path) -> None:
    r = nvcc_check(cuda_source(graph(family), tmp_path), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


@needs_nvcc
@pytest.mark.slow
def test_tiny_cnn_source_compiles_with_nvcc_for_sm_80_and_sm_90(tmp_path: Path) -> None:
    src = cuda_source(EXAMPLES / "tiny_cnn.onnx", tmp_path)
    for arch in ("sm_80", "sm_90"):
        r = nvcc_check(src, tmp_path, arch)
        assert r.returncode == 0, r.stderr[-3000:]


HOSTILE = '*/ #include <stdlib.h>\n"; system("x"); /* \\'


def hostile_model(path: Path) -> Path:
    nodes = [helper.make_node("Relu", [HOSTILE + "in"], [HOSTILE + "mid"], name=HOSTILE + "node"),
             helper.make_node("Exp", [HOSTILE + "mid"], [HOSTILE + "out"], name="??=" + HOSTILE)]
    g = helper.make_graph(nodes, HOSTILE, [helper.make_tensor_value_info(HOSTILE + "in", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info(HOSTILE + "out", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _code_only(src: str) -> str:
    """``src`` without its comments and the contents of its string literals (a C lexer's view)."""
    out, i = [], 0
    while i < len(src):
        if src.startswith("/*", i):
            i = src.index("*/", i + 2) + 2
        elif src[i] == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append('""')
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def test_hostile_names_stay_in_comments_and_strings(tmp_path: Path) -> None:
    src = cuda_source(hostile_model(tmp_path / "h.onnx"), tmp_path).read_text()
    assert HOSTILE not in src
    # with every comment and string literal taken out, nothing of the names is left
    code = _code_only(src)
    assert "system" not in code and "stdlib" not in code and "??=" not in code
    for line in src.split("\n"):
        assert not line.lstrip().startswith("#") or line.lstrip().startswith(("#include \"cuvil_", "#define CUVIL_"))
    if nvcc() is not None:
        r = nvcc_check(next((tmp_path / "cache").rglob("model.c")), tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]


def test_nvcc_is_found_on_path_else_in_a_toolkit_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "TOOLKIT_HOMES", [str(tmp_path / "none")])
    assert toolchain.find_nvcc() is None
    assert "nvcc" in (get_backend("cuda").unavailable() or "")
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    from cuvil.commands.common import configure_toolkits

    configure_toolkits()  # what the command line does first: CUDA_HOME joins the folders
    assert toolchain.find_nvcc() == str(fake)


def test_cuda_without_nvcc_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(toolchain, "TOOLKIT_HOMES", [])
    with pytest.raises(cuvil.errors.CuvilError, match="nvcc was not found"):
        cuvil.compile(graph("elementwise"), target="cuda", cache_dir=str(tmp_path))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([sys.executable, "-m", "cuvil", *args], capture_output=True, text=True, env=env, timeout=600)


def test_compile_for_hip_writes_the_source_and_its_hipcc_command(tmp_path: Path) -> None:
    r = _cli("compile", str(EXAMPLES / "tiny_cnn.onnx"), "-t", "hip", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    meta = json.loads((out / "meta.json").read_text())
    assert meta["backend"] == "cuda" and meta["target"] == "hip"
    assert "hipcc" in meta["rebuild"] and "model.cu" in meta["rebuild"]
    assert "hipcc" in (out / "build.sh").read_text()
    assert (out / "model.cu").read_text().startswith("/* Generated by Cuvil")
    assert (out / "cuvil_cuda.h").is_file() and (out / "cuvil_api.h").is_file()


@needs_nvcc
@pytest.mark.slow
def test_cuda_without_a_gpu_builds_saves_and_says_it_cannot_run(tmp_path: Path) -> None:
    if toolchain.gpu_missing() is None:
        pytest.skip("this machine has a GPU")
    m = cuvil.compile(graph("elementwise"), target="cuda:sm_90", cache_dir=str(tmp_path / "cache"))
    folder = m.save(tmp_path / "art")
    assert (folder / "model.so").stat().st_size > 0
    with pytest.raises(cuvil.errors.CuvilError, match="cannot run here: this machine has no CUDA GPU"):
        m(*[__import__("numpy").zeros((2, 4), "f4"), __import__("numpy").zeros(4, "f4"),
            __import__("numpy").zeros((2, 1), "f4")])


@needs_nvcc
def test_fp16_source_compiles_with_nvcc_warnings_as_errors(tmp_path: Path) -> None:
    m = cuvil.compile(EXAMPLES / "tiny_cnn.onnx", target="hip", precision="fp16", cache_dir=str(tmp_path / "cache"))
    r = nvcc_check(m.build_info.source, tmp_path)  # type: ignore[union-attr]
    assert r.returncode == 0, r.stderr[-3000:]


def test_cross_target_compares_the_cuda_targets_only_when_asked() -> None:
    from cuvil.verify.checks.cross_target import default_targets

    assert not {"cuda", "cuda:sm_80", "cuda:sm_90", "cuda-sim", "hip"} & set(default_targets())
    assert "native" in default_targets()

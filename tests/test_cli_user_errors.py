"""Malformed models and artifacts through the command line: exit 2 and one line on stderr, never a traceback.

Each case is a model or artifact a careless user or an attacker could hand to
``cuvil compile`` or ``cuvil run``; the README promises a one-line error for
every user error.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import cuvil
from cuvil.cli import main


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits or []),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _f32(name: str, shape: list[Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cuvil: error: "), err
    return lines[0]


# ---- models ------------------------------------------------------------------------------------------------------


def loop_body_not_a_graph() -> bytes:
    node = helper.make_node("Loop", ["M", "", "x"], ["y"], name="loop0")
    node.attribute.append(helper.make_attribute("body", 3))
    return _model([node], [helper.make_tensor_value_info("M", TensorProto.INT64, []), _f32("x", [3])],
                  [_f32("y", [3])]).SerializeToString()


def nul_in_external_location() -> bytes:
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="we\0ights.bin")
    w.external_data.add(key="length", value="16")
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_f32("x", [4])], [_f32("y", [4])],
                  [w]).SerializeToString()


def invalid_utf8_dim_param() -> bytes:
    data = _model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", ["n"])], [_f32("y", ["n"])]).SerializeToString()
    assert data.count(b"\x12\x01n") == 2  # Dimension.dim_param = "n", in the input and the output
    return data.replace(b"\x12\x01n", b"\x12\x01\xff")


def _with_attr(op: str, name: str, value: Any, out_shape: list[int], inputs: int = 1) -> bytes:
    node = helper.make_node(op, ["x"] * inputs, ["y"], name="n0")
    node.attribute.append(helper.make_attribute(name, value))
    return _model([node], [_f32("x", [2, 3])], [_f32("y", out_shape)]).SerializeToString()


@pytest.mark.parametrize(("build", "message"), [
    (loop_body_not_a_graph, "node 'loop0' (Loop): attribute 'body' is INT, the op declares it GRAPH"),
    (nul_in_external_location, "external data location 'we\\x00ights.bin' holds a NUL byte"),
    (invalid_utf8_dim_param, "the name of dim 0 of 'x' is not valid UTF-8 text"),
    (lambda: _with_attr("Softmax", "axis", 1.0, [2, 3]),
     "node 'n0' (Softmax): attribute 'axis' is FLOAT, the op declares it INT"),
    (lambda: _with_attr("Concat", "axis", 0.0, [4, 3], inputs=2),
     "node 'n0' (Concat): attribute 'axis' is FLOAT, the op declares it INT"),
    (lambda: _with_attr("Transpose", "perm", [1.0, 0.0], [3, 2]),
     "node 'n0' (Transpose): attribute 'perm' is FLOATS, the op declares it INTS"),
], ids=["loop_body_int", "nul_location", "utf8_dim_param", "softmax_float_axis", "concat_float_axis",
        "transpose_float_perm"])
@pytest.mark.parametrize("target", ["ref", "native"])
def test_malformed_model_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     build: Callable[[], bytes], message: str, target: str) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(build())
    assert message in _one_line_error(capsys, "compile", str(path), "-t", target)


def test_random_inputs_too_big_are_refused_with_the_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.onnx"
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", [1 << 20, 1 << 20])],
                     [_f32("y", [1 << 20, 1 << 20])]), str(path))
    line = _one_line_error(capsys, "run", str(path), "--random")
    assert "input 'x' of shape [1048576, 1048576] holds 1,099,511,627,776 elements" in line and "--dim" in line


def test_an_output_name_too_long_for_npz_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, name = tmp_path / "long.onnx", "o" * 70_000
    onnx.save(_model([helper.make_node("Relu", ["x"], [name])], [_f32("x", [2])], [_f32(name, [2])]), str(path))
    line = _one_line_error(capsys, "run", str(path), "--random", "-o", str(tmp_path / "out.npz"))
    assert "has a name of 70,000 characters, too long for an .npz member" in line
    assert not (tmp_path / "out.npz").exists()


# ---- artifacts ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_f32("x", ["n", 3])], [_f32("y", ["n", 3])])
    return cuvil.compile(m, "native", cache_dir=str(tmp_path_factory.mktemp("cache"))).save(
        tmp_path_factory.mktemp("art") / "relu")


def _meta(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        meta = json.loads((folder / "meta.json").read_text())
        edit(meta)
        (folder / "meta.json").write_text(json.dumps(meta))
    return apply


def _deep(folder: Path) -> None:
    (folder / "meta.json").write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")


def _shape(shape: list[Any]) -> Callable[[Path], None]:
    return _meta(lambda m: m["inputs"][0].__setitem__("shape", shape))


def _library_without_cuvil_load(folder: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None
    (folder / "other.c").write_text("int cuvil_num_inputs(void) { return 1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(folder / "model.so"), str(folder / "other.c")], check=True)
    (folder / "other.c").unlink()
    data = (folder / "model.so").read_bytes()
    _meta(lambda m: m["digests"].__setitem__("model.so", {"size": len(data),
                                                           "sha256": hashlib.sha256(data).hexdigest()}))(folder)


@pytest.mark.parametrize(("edit", "message"), [
    (_deep, "meta.json: nested too deeply"),
    (_shape([1] * 9), "inputs 0 ('x') has rank 9; the runtime takes at most 8"),
    (_shape([-1, 3]), "inputs 0 ('x'): dim -1 is not a size"),
    (_shape([1 << 70, 3]), f"inputs 0 ('x'): dim {1 << 70} is not a size"),
    (_library_without_cuvil_load, "model.so is not a Cuvil model library: it lacks cuvil_load"),
], ids=["deep", "rank9", "negative_dim", "huge_dim", "no_cuvil_load"])
def test_malformed_artifact_is_one_line(saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        edit: Callable[[Path], None], message: str) -> None:
    folder = tmp_path / "art"
    shutil.copytree(saved, folder)
    edit(folder)
    assert message in _one_line_error(capsys, "run", str(folder), "--random")
    with pytest.raises(cuvil.ModelError) as info:
        cuvil.load(folder)
    assert type(info.value).__name__ == "ArtifactError"

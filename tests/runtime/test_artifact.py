"""Saved artifacts: save, cuvil.load without the original model, meta.json, checks, and the C example program."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.runtime.artifact import ArtifactError
from tests.support.paths import REPO

EXAMPLE_C = REPO / "examples" / "c" / "run_model.c"


def conv_model(channels: int = 4, bias: float = 0.5) -> onnx.ModelProto:
    """x[batch, 3, 8, 8] -> relu(conv(x) + bias) * x_mean-ish: a symbolic dim, weights, several op kinds."""
    rng = np.random.default_rng(channels)
    w = rng.standard_normal((channels, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Add", ["c", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=1, name="sum"),
        helper.make_node("Mul", ["r", "s"], ["y"], name="mul"),
    ]
    g = helper.make_graph(
        nodes, "conv_model",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", channels, 8, 8])],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.array([bias], np.float32), "b"),
         onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "conv.onnx"
    onnx.save(conv_model(), str(path))
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory, model_file: Path, cache: str) -> Path:
    m = cuvil.compile(str(model_file), "native", dims={"batch": (1, 16)}, cache_dir=cache)
    return m.save(tmp_path_factory.mktemp("art") / "conv")


def x(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 8, 8)).astype(np.float32)


def test_saved_folder_holds_source_header_library_weights_meta(saved: Path) -> None:
    names = {p.name for p in saved.iterdir()}
    assert {"meta.json", "model.c", "cuvil_api.h", "cuvil_rt.h", "cuvil_model_api.inc", "model.so",
            "weights.bin"} <= names
    assert not any(n.startswith(".") for n in names)
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["format"] == "cuvil-artifact" and meta["format_version"] == 1
    assert meta["cuvil_version"] == cuvil.__version__ and meta["target"] == "native" and meta["backend"] == "c"
    assert meta["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["batch", "3", "8", "8"]}]
    assert meta["outputs"] == [{"name": "y", "dtype": "f32", "shape": ["batch", "4", "8", "8"]}]
    assert meta["symbols"] == [{"name": "batch", "min": 1, "max": 16, "multiple_of": None}]
    assert meta["files"] == {"source": "model.c", "header": "cuvil_api.h", "library": "model.so",
                             "weights": "weights.bin"}
    assert meta["compiler"]["version"] and "-march=native" in meta["compiler"]["flags"]
    assert not any(f.startswith("-I") for f in meta["compiler"]["flags"])
    assert meta["compile"]["source_kind"] == "onnx file" and meta["compile"]["model_name"] == "conv_model"
    assert meta["compile"]["seconds"] > 0 and meta["compile"]["compiled_at"].endswith("+00:00")
    assert set(meta["digests"]) == names - {"meta.json"}
    assert meta["digests"]["weights.bin"]["size"] == (saved / "weights.bin").stat().st_size > 4 * 27 * 4


def test_source_hash_is_the_model_files_sha256(saved: Path, model_file: Path) -> None:
    meta = json.loads((saved / "meta.json").read_text())
    assert meta["compile"]["source_sha256"] == hashlib.sha256(model_file.read_bytes()).hexdigest()


def test_load_runs_without_the_original_model(saved: Path, model_file: Path, tmp_path: Path) -> None:
    ref = cuvil.compile(str(model_file), "ref", dims={"batch": (1, 16)})
    moved = tmp_path / "elsewhere"
    shutil.copytree(saved, moved)
    m = cuvil.load(moved)
    assert m.target == "native" and m.graph is None
    assert m.input_names == ["x"] and m.output_names == ["y"]
    assert m.symbols["batch"].max == 16
    for batch in (1, 5):  # the symbolic dim at two shapes
        (got,) = m(x(batch, batch))
        (want,) = ref(x(batch, batch))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(cuvil.InputError, match="above its maximum 16"):
        m(x(17))
    assert m.info.source_kind == "onnx file" and m.info.cached is not None


def test_a_loaded_model_saves_again(saved: Path, tmp_path: Path) -> None:
    again = cuvil.load(saved).save(tmp_path / "again")
    a = json.loads((saved / "meta.json").read_text())
    b = json.loads((again / "meta.json").read_text())
    assert a == b
    (y1,) = cuvil.load(again)(x(2))
    (y2,) = cuvil.load(saved)(x(2))
    assert y1.tobytes() == y2.tobytes()


def test_folder_rebuilds_standalone(saved: Path, tmp_path: Path) -> None:
    """The "rebuild" command in meta.json, run inside a copy of the folder, gives a library that runs alike."""
    copy = tmp_path / "copy"
    shutil.copytree(saved, copy)
    (copy / "model.so").unlink()
    meta = json.loads((copy / "meta.json").read_text())
    r = subprocess.run(meta["rebuild"], shell=True, cwd=copy, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # no warnings
    meta["digests"]["model.so"] = {"size": (copy / "model.so").stat().st_size,
                                  "sha256": hashlib.sha256((copy / "model.so").read_bytes()).hexdigest()}
    (copy / "meta.json").write_text(json.dumps(meta))
    (a,) = cuvil.load(copy)(x(3))
    (b,) = cuvil.load(saved)(x(3))
    assert a.tobytes() == b.tobytes()


def test_replacing_an_artifact_loads_the_new_library(tmp_path: Path, cache: str) -> None:
    """The same folder saved twice with different models, loaded in one process: each load runs its own model."""
    dest = tmp_path / "art"
    cuvil.compile(conv_model(4, 0.5), "generic", cache_dir=cache).save(dest)
    first = cuvil.load(dest)
    cuvil.compile(conv_model(6, -1.0), "generic", cache_dir=cache).save(dest)
    second = cuvil.load(dest)
    assert first(x(1))[0].shape == (1, 4, 8, 8)
    (got,) = second(x(1))
    (want,) = cuvil.compile(conv_model(6, -1.0), "ref")(x(1))
    assert got.shape == (1, 6, 8, 8)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert [p.name for p in tmp_path.iterdir()] == ["art"]  # no temporary folders left


def test_save_refuses_ref_and_foreign_folders(tmp_path: Path, cache: str) -> None:
    with pytest.raises(cuvil.CuvilError, match="target 'ref' cannot be saved"):
        cuvil.compile(conv_model(), "ref").save(tmp_path / "ref")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    m = cuvil.compile(conv_model(), "generic", cache_dir=cache)
    with pytest.raises(cuvil.CuvilError, match="not empty and holds no Cuvil artifact"):
        m.save(busy)
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(cuvil.CuvilError, match="not a folder"):
        m.save(tmp_path / "file")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cuvil.load(m.save(empty)).target == "generic"


class _OtherBackend:
    """An executor of some other backend: save asks it for its files and facts, and knows nothing else of it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def run(self, inputs: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        return inputs

    def artifact_files(self) -> dict[str, Path]:
        return {"model.wasm": self.folder / "m.wasm", "weights.bin": self.folder / "w.bin"}

    def artifact_meta(self) -> dict[str, object]:
        return {"backend": "wasm", "files": {"library": "model.wasm", "weights": "weights.bin"}, "engine": "any"}


def test_save_is_generic_over_backends(tmp_path: Path) -> None:
    from cuvil.runtime.artifact import read_meta
    from cuvil.runtime.compiled import CompiledModel

    (tmp_path / "m.wasm").write_bytes(b"\0asm")
    (tmp_path / "w.bin").write_bytes(b"")
    ref = cuvil.compile(conv_model(), "ref")
    m = CompiledModel(ref.signature, _OtherBackend(tmp_path), "wasm32", None, ref.info)
    folder = m.save(tmp_path / "art")
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "model.wasm", "weights.bin"]
    meta = read_meta(folder)
    assert meta["backend"] == "wasm" and meta["engine"] == "any" and meta["target"] == "wasm32"
    assert meta["files"] == {"library": "model.wasm", "weights": "weights.bin"}
    assert meta["digests"]["model.wasm"]["size"] == 4


def _broken(saved: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(saved, copy)
    return copy


def _edit_meta(folder: Path, **changes: object) -> None:
    meta = json.loads((folder / "meta.json").read_text())
    for k, v in changes.items():
        if v is None:
            del meta[k]
        else:
            meta[k] = v
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("no_folder", "no such folder"),
        ("no_meta", "holds no meta.json"),
        ("bad_json", "not valid JSON"),
        ("json_list", "must hold a JSON object"),
        ("wrong_format", "\"format\" must be 'cuvil-artifact'"),
        ("newer_version", "format_version 2"),
        ("no_target", "missing 'target'"),
        ("unknown_backend", "unknown backend 'cuda9'"),
        ("inputs_not_list", "'inputs' must be a list"),
        ("bad_dtype", "malformed inputs, outputs, symbols"),
        ("no_library_role", "names no library file"),
        ("digest_path", "bad \"digests\" entry '../model.so'"),
        ("missing_weights", "weights.bin is missing"),
        ("short_weights", "weights.bin holds 3 bytes"),
        ("changed_library", "model.so does not match its sha256"),
    ],
)
def test_load_checks_meta_and_files(saved: Path, tmp_path: Path, breakage: str, message: str) -> None:
    folder = _broken(saved, tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    if breakage == "no_folder":
        folder = tmp_path / "nothing"
    elif breakage == "no_meta":
        (folder / "meta.json").unlink()
    elif breakage == "bad_json":
        (folder / "meta.json").write_text("{\"format\": ")
    elif breakage == "json_list":
        (folder / "meta.json").write_text("[]")
    elif breakage == "wrong_format":
        _edit_meta(folder, format="onnx")
    elif breakage == "newer_version":
        _edit_meta(folder, format_version=2)
    elif breakage == "no_target":
        _edit_meta(folder, target=None)
    elif breakage == "unknown_backend":
        _edit_meta(folder, backend="cuda9")
    elif breakage == "inputs_not_list":
        _edit_meta(folder, inputs={"x": 1})
    elif breakage == "bad_dtype":
        _edit_meta(folder, inputs=[{"name": "x", "dtype": "f31", "shape": ["3"]}])
    elif breakage == "no_library_role":
        _edit_meta(folder, files={k: v for k, v in meta["files"].items() if k != "library"})
    elif breakage == "digest_path":
        _edit_meta(folder, digests={**meta["digests"], "../model.so": {"size": 1, "sha256": "0"}})
    elif breakage == "missing_weights":
        (folder / "weights.bin").unlink()
    elif breakage == "short_weights":
        (folder / "weights.bin").write_bytes(b"abc")
    elif breakage == "changed_library":
        data = bytearray((folder / "model.so").read_bytes())
        data[-1] ^= 0xFF
        (folder / "model.so").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=message.replace("(", r"\(")) as info:
        cuvil.load(folder)
    assert isinstance(info.value, cuvil.ModelError)


# ---- the C example program ---------------------------------------------------------------------------------------


def _read_ct(path: Path) -> np.ndarray:
    """A tensor file written by examples/c/run_model.c."""
    from cuvil.backends.c import ctypes_map as ct
    from cuvil.ir.dtypes import DType

    data = path.read_bytes()
    assert data[:4] == b"CUVT"
    dtype, rank = np.frombuffer(data, "<u4", 2, 4)
    shape = tuple(int(d) for d in np.frombuffer(data, "<i8", int(rank), 12))
    np_dtype = {ct.code(d): d for d in DType}[int(dtype)].np
    return np.frombuffer(data, np_dtype, offset=12 + 8 * int(rank)).reshape(shape)


def _write_ct(path: Path, a: np.ndarray) -> None:
    from cuvil.backends.c import ctypes_map as ct
    from cuvil.ir.dtypes import DType

    header = b"CUVT" + np.array([ct.code(DType.from_np(a.dtype)), a.ndim], "<u4").tobytes()
    path.write_bytes(header + np.array(a.shape, "<i8").tobytes() + np.ascontiguousarray(a).tobytes())


def _fnv1a(a: np.ndarray) -> str:
    h = 0xCBF29CE484222325
    for b in np.ascontiguousarray(a).tobytes():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.mark.parametrize("link", ["library", "source"])
def test_c_example_program_runs_the_artifact(saved: Path, tmp_path: Path, link: str) -> None:
    """examples/c/run_model.c, built against the artifact's library or its model.c, matches Python."""
    exe = tmp_path / "run_model"
    meta = json.loads((saved / "meta.json").read_text())
    if link == "library":
        cmd = ["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror", f"-I{saved}", str(EXAMPLE_C),
               str(saved / "model.so"), f"-Wl,-rpath,{saved}", "-o", str(exe)]
    else:  # the generated C compiled into the program, with the artifact's own flags
        flags = [f for f in meta["compiler"]["flags"] if f not in ("-shared", "-fPIC", "-fvisibility=hidden")]
        cmd = ["cc", *flags, f"-I{saved}", str(EXAMPLE_C), str(saved / "model.c"), "-lm", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stderr == "", r.stderr

    m = cuvil.load(saved)
    inp = x(3, 11)
    _write_ct(tmp_path / "x.ct", inp)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = subprocess.run([str(exe), "-o", str(out_dir), str(saved / "weights.bin"), str(tmp_path / "x.ct")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    (want,) = m(inp)
    line = r.stdout.strip()
    assert line.startswith("output 0: f32 [3, 4, 8, 8] sum ")
    assert line.endswith(f"fnv1a {_fnv1a(want)}")  # bitwise the Python result
    assert float(line.split(" sum ")[1].split()[0]) == pytest.approx(float(want.astype(np.float64).sum()), rel=1e-6)
    np.testing.assert_array_equal(_read_ct(out_dir / "output_0.ct"), want)

    # random inputs: the program writes what it drew, so Python can run the same
    r = subprocess.run([str(exe), "-o", str(out_dir), str(saved / "weights.bin"), "random:f32:2x3x8x8:7"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    drawn = _read_ct(out_dir / "input_0.ct")
    assert drawn.shape == (2, 3, 8, 8) and -1 <= drawn.min() < drawn.max() < 1
    (want,) = m(drawn)
    assert r.stdout.strip().endswith(f"fnv1a {_fnv1a(want)}")

    # the model's input checks hold in C too
    r = subprocess.run([str(exe), str(saved / "weights.bin"), "random:f32:2x3x8x9"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "input x: dim 3 must be 8, got 9" in r.stderr

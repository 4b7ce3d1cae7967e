"""A saved artifact's meta.json against its library: what the library says about itself wins.

meta.json is not covered by the digests it holds, so an edited one must not make the
Python side size or check inputs differently from what the library reads.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import cuvil
from cuvil.runtime.artifact import ArtifactError


def _two_by_two() -> onnx.ModelProto:
    """(x f32[n, 3], k i64[]) -> (x * 2 f32[n, 3], k + k i64[])."""
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Add", ["k", "k"], ["kk"])], "two_by_two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]),
         helper.make_tensor_value_info("kk", TensorProto.INT64, [])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    m = cuvil.compile(_two_by_two(), "native", cache_dir=str(cache))
    return m.save(tmp_path_factory.mktemp("art") / "two")


def _edited(saved: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(saved, folder)
    meta = json.loads((folder / "meta.json").read_text())
    edit(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda meta: meta.__setitem__(key, value)


def test_the_unedited_artifact_loads_and_runs(saved: Path) -> None:
    m = cuvil.load(saved)
    y, kk = m(np.ones((2, 3), np.float32), np.array(4, np.int64))
    np.testing.assert_array_equal(y, np.full((2, 3), 2.0, np.float32))
    assert int(kk) == 8


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["inputs"].pop(), "it lists 1 inputs, the library has 2"),
    (lambda m: m["outputs"].pop(), "it lists 1 outputs, the library has 2"),
    (lambda m: m["outputs"].append({"name": "extra", "dtype": "f32", "shape": [3]}), "it lists 3 outputs"),
    (lambda m: m["inputs"][0].__setitem__("dtype", "f64"),
     "inputs 0 ('x') is listed as f64 of rank 2, the library's is f32 of rank 2"),
    (lambda m: m["outputs"][1].__setitem__("dtype", "i32"), "outputs 1 ('kk') is listed as i32 of rank 0"),
    (lambda m: m["inputs"][0].__setitem__("shape", ["n"]), "inputs 0 ('x') is listed as f32 of rank 1"),
    (lambda m: m["inputs"].reverse(), "inputs 0 ('k') is listed as i64 of rank 0, the library's is f32 of rank 2"),
    (_set("target", "generic"), "\"target\" is 'generic', the library was built for 'native'"),
], ids=["input_removed", "output_removed", "output_added", "input_dtype", "output_dtype", "input_rank",
        "inputs_swapped", "target"])
def test_meta_that_disagrees_with_the_library_is_refused(saved: Path, tmp_path: Path,
                                                         edit: Callable[[dict[str, Any]], None], message: str) -> None:
    folder = _edited(saved, tmp_path, edit)
    with pytest.raises(ArtifactError, match="meta.json disagrees with model.so: " + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        cuvil.load(folder)


@pytest.mark.parametrize("symbols", [
    [{"name": "n", "min": "1", "max": None, "multiple_of": None}],
    [{"name": "n", "min": None, "max": 2.5, "multiple_of": None}],
    [{"name": "n", "min": None, "max": None, "multiple_of": True}],
    [{"name": 7}],
    ["n"],
], ids=["min_string", "max_float", "multiple_bool", "name_int", "not_an_object"])
def test_symbols_of_the_wrong_type_are_refused(saved: Path, tmp_path: Path, symbols: list[Any]) -> None:
    folder = _edited(saved, tmp_path, _set("symbols", symbols))
    with pytest.raises(ArtifactError, match="bad \"symbols\" entry"):
        cuvil.load(folder)


def test_the_library_reports_its_own_facts(saved: Path) -> None:
    m = cuvil.load(saved)
    native = m._executor.native  # type: ignore[attr-defined]
    assert (native.n_inputs, native.n_outputs) == (2, 2)
    assert native.signature.target == "native"
    assert native.signature.inputs == (("f32", 2), ("i64", 0))
    assert native.signature.outputs == (("f32", 2), ("i64", 0))

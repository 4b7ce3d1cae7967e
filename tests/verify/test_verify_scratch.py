"""verify's scratch folder: kept when the caller names it, removed when verify made it."""
from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import cuvil


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _scratch() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("cuvil-verify-*")}


def test_a_scratch_folder_verify_made_is_removed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = cuvil.verify(_model(), targets=["ref"], checks=["reproducibility"])
    assert report.results and report.exit_status == 0
    assert _scratch() == set(), "verify left its scratch folder behind"


def test_a_named_work_dir_is_kept(tmp_path: Path) -> None:
    work = tmp_path / "work"
    report = cuvil.verify(_model(), targets=["native"], checks=["reproducibility"], work_dir=work)
    assert report.exit_status == 0
    assert any(work.rglob("*")), "the named work folder was emptied"

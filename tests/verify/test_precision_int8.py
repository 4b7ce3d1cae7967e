"""The ``precision`` check's int8 part: calibration data from the config, the verdicts, and the message without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cuvil.verify.checks  # noqa: F401  (registers the checks)
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.types import TensorType
from cuvil.verify import verify
from cuvil.verify.base import CheckResult, Status, VerifyError, get_check
from cuvil.verify.config import load_config
from cuvil.verify.context import ModelSource, VerifyContext

ROWS, FEATURES, HIDDEN, CLASSES = 4, 32, 64, 10
SAMPLES = 64  # the compile's minimum number of calibration examples


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` calls' inputs (ROWS rows each) around 10 class prototypes, and each row's class."""
    protos = np.random.default_rng(100).standard_normal((CLASSES, FEATURES))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, (n, ROWS))
    x = protos[labels] + 0.3 * rng.standard_normal((n, ROWS, FEATURES))
    return x.astype(np.float32), labels


def _model() -> Graph:
    """x[4, 32] -> gemm -> relu -> matmul: "logits" (a head fitted to the data's classes), and beside it
    tanh(x W) reshaped to [4, 2, 8]: "code", an output that is no classifier."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32)
    c1 = (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)
    x, labels = _data(64, seed=1)
    h = np.maximum(x.reshape(-1, FEATURES) @ w1 + c1, 0.0).astype(np.float64)
    # least squares to one-hot targets: the classes are separated, so top-1 is not a near tie
    w2 = np.linalg.lstsq(h, 4.0 * np.eye(CLASSES)[labels.reshape(-1)], rcond=None)[0].astype(np.float32)
    b = Builder()
    xv = b.input("x", TensorType(DType.f32, (ROWS, FEATURES)))
    hv = b.add1("gemm", [xv, b.constant(w1, name="w1"), b.constant(c1, name="c1")], names=["h"], node_name="fc1")
    r = b.add1("relu", [hv], names=["r"], node_name="act")
    logits = b.add1("matmul", [r, b.constant(w2, name="w2")], names=["logits"], node_name="head")
    w3 = (rng.standard_normal((FEATURES, 16)) / np.sqrt(FEATURES)).astype(np.float32)
    t = b.add1("tanh", [b.add1("matmul", [xv, b.constant(w3, name="w3")], names=["p"], node_name="proj")],
               names=["t"], node_name="squash")
    code = b.add1("reshape", [t, b.constant(np.array([ROWS, 2, 8], np.int64))], names=["code"], node_name="shape")
    b.output(logits, code)
    return b.graph


def _folder(root: Path, name: str, n: int, seed: int) -> Path:
    folder = root / name
    folder.mkdir()
    for i, x in enumerate(_data(n, seed)[0]):
        np.savez(folder / f"{i:04d}.npz", x=x)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int8-data")
    return {"calibration": _folder(root, "calib", SAMPLES, seed=2), "held_out": _folder(root, "held-out", 32, seed=3),
            "few": _folder(root, "few", 16, seed=4), "cache": root / "cache"}


def _run(data: dict[str, Path], work: Path, **options: Any) -> CheckResult:
    ctx = VerifyContext(ModelSource("graph", _model()), targets=["native"], cache_dir=str(data["cache"]),
                        work_dir=work, config={"checks": {"precision": {"precisions": ["int8"], **options}}})
    (r,) = get_check("precision")().run(ctx)
    return r


def test_int8_passes_with_figures_per_output_and_worst_layers(data: dict[str, Path], tmp_path: Path) -> None:
    r = _run(data, tmp_path, calibration=str(data["calibration"]), int8_samples=str(data["held_out"]))
    assert r.status is Status.PASS, r.summary
    assert r.details["precisions"]["int8"] == "checked"
    d = r.details["int8"]
    assert d["samples"] == 32 and d["judged_on"] == str(data["held_out"])
    rows = {row["output"]: row for row in d["outputs"]}
    assert rows["logits"]["kind"] == "classifier" and rows["logits"]["rows"] == 32 * ROWS
    assert rows["code"]["kind"] == "snr" and rows["code"]["node"] == "shape"
    # int8 is close, not exact: the check measured a quantized build
    assert 0.99 <= rows["logits"]["top1_agreement"] <= 1.0 and 30.0 <= rows["code"]["snr_db"] < 80.0
    assert r.figures["int8_top1_agreement"] == rows["logits"]["top1_agreement"]
    assert r.figures["int8_snr_db"] == rows["code"]["snr_db"]
    assert "int8_top1_agreement" in r.details["higher_is_better"]
    # per-layer errors from the compile's accuracy metadata, worst first
    layers = d["worst_layers"]
    assert layers and {"name", "node", "op", "rel_l2", "snr_db"} <= set(layers[0])
    assert [float(x["rel_l2"]) for x in layers] == sorted((float(x["rel_l2"]) for x in layers), reverse=True)
    assert d["quantized_nodes"] >= 2 and d["calibration_examples"] == SAMPLES
    assert "; int8: top-1 agreement with fp32" in r.summary and "output SNR" in r.summary
    # symmetric int8 on the one-sided relu output: the compile's warning is reported, not dropped
    assert any("tensor 'r': symmetric int8" in w for w in d["warnings"])
    assert f"({len(d['warnings'])} calibration warnings in the details)" in r.summary


def test_int8_fails_when_a_threshold_cannot_be_met(data: dict[str, Path], tmp_path: Path) -> None:
    r = _run(data, tmp_path, calibration=str(data["calibration"]), int8_min_snr_db=200.0)
    assert r.status is Status.FAIL
    assert r.summary.startswith("int8 output 'code': SNR ") and "below 200 dB on 64 samples" in r.summary
    assert "worst layer: node" in r.summary
    assert r.where["precision"] == "int8" and r.where["output"] == "code" and r.where["node"] == "shape"
    assert r.where["target"] == "native" and r.where["layer"]


def test_named_classifiers_replace_the_automatic_choice(data: dict[str, Path], tmp_path: Path) -> None:
    """``classifier_outputs`` makes "code" a classifier too: top-1 over its last axis (8 values per row)."""
    r = _run(data, tmp_path, calibration=str(data["calibration"]), classifier_outputs=["logits", "code"],
             int8_min_top1=0.0)
    assert r.status is Status.PASS, r.summary
    rows = {row["output"]: row for row in r.details["int8"]["outputs"]}
    assert rows["code"]["kind"] == rows["logits"]["kind"] == "classifier"
    assert rows["code"]["rows"] == SAMPLES * ROWS * 2 and rows["logits"]["rows"] == SAMPLES * ROWS
    assert r.figures["int8_top1_agreement"] == min(rows["code"]["top1_agreement"], rows["logits"]["top1_agreement"])
    assert "int8_snr_db" not in r.figures and "output SNR" not in r.summary


def test_without_calibration_data_int8_is_not_checked_and_says_how(data: dict[str, Path], tmp_path: Path) -> None:
    r = _run(data, tmp_path)
    assert r.status is Status.PASS
    msg = r.details["precisions"]["int8"]
    assert msg.startswith("not checked: int8 needs calibration data; set calibration = \"DIR\" in [checks.precision]")
    assert "int8" not in r.details
    assert r.summary.endswith('; int8 not checked: no calibration data ([checks.precision] calibration = "DIR")')


def test_a_refused_int8_compile_fails_with_the_compilers_message(data: dict[str, Path], tmp_path: Path) -> None:
    r = _run(data, tmp_path, calibration=str(data["few"]))
    assert r.status is Status.FAIL and r.summary.startswith("int8: the model does not compile: ")
    assert "16" in r.summary and "64" in r.summary  # how many there are, and how many it takes
    assert r.where == {"target": "native", "precision": "int8"}


@pytest.mark.parametrize(("options", "message"), [
    ({"calibration": "x", "int8_min_top1": 1.5}, "int8_min_top1 must be a fraction in [0, 1]"),
    ({"calibration": "x", "calibration_method": "mean"}, "calibration_method must be one of minmax"),
    ({"calibration": "x", "symmetric": "yes"}, "symmetric must be true or false"),
    ({"calibration": "x", "classifier_outputs": "logits"}, 'classifier_outputs must be "auto" or a list'),
    ({"calibration_method": "entropy"}, "calibration_method is an int8 setting"),
])
def test_bad_int8_settings_are_usage_errors(data: dict[str, Path], tmp_path: Path, options: dict[str, Any],
                                            message: str) -> None:
    with pytest.raises(VerifyError, match=r"\[checks.precision\] " + message.replace("[", r"\[")):
        _run(data, tmp_path, **options)


def test_samples_that_do_not_fit_are_a_usage_error(data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="does not exist"):
        _run(data, tmp_path, calibration=str(tmp_path / "missing"))
    with pytest.raises(VerifyError, match=r"'nope'.*not outputs of the model"):
        _run(data, tmp_path, calibration=str(data["calibration"]), classifier_outputs=["nope"])


def test_config_file_folder_is_relative_to_the_file_and_verify_runs_it(data: dict[str, Path], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "calib").symlink_to(data["calibration"], target_is_directory=True)
    (project / "cuvil.toml").write_text('[checks.precision]\nprecisions = ["int8"]\ncalibration = "calib"\n'
                                        "symmetric = false\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(project / "cuvil.toml")
    assert config.checks["precision"]["calibration"] == str(project.resolve() / "calib")
    report = verify(_model(), checks="precision", targets=["native"], config=project / "cuvil.toml",
                    cache_dir=data["cache"], work_dir=tmp_path / "work")
    (r,) = [x for x in report.results if x.target == "native"]
    assert r.status is Status.PASS, r.summary
    assert r.details["int8"]["calibration"] == str(project.resolve() / "calib")
    assert r.details["int8"]["quantization"] == {"symmetric": False, "per_channel": True, "calibration": "minmax"}


def test_readme_int8_settings_are_the_checks() -> None:
    """The README's [checks.precision] example parses as written, each key with the meaning it gives it."""
    import re
    import tomllib

    from cuvil.verify.checks.precision_int8 import int8_settings

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```toml\n(\[checks\.precision\].*?)```", readme, re.S)
    table = tomllib.loads(block)["checks"]["precision"]
    settings = int8_settings(table)
    assert settings is not None and set(table) == {
        "calibration", "int8_samples", "symmetric", "per_channel", "calibration_method", "int8_min_top1",
        "int8_min_snr_db", "classifier_outputs"}
    assert (settings.calibration, settings.samples) == (Path("calib"), Path("held-out"))
    assert (settings.min_top1, settings.min_snr_db, settings.classifiers) == (0.99, 30.0, None)

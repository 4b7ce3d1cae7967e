"""The fleet file: its minimal form, defaults and per-model settings, paths relative to it, and clear
errors for bad files; the job keys that name results."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil.cli import main
from cuvil.verify.base import VerifyError
from cuvil.verify.fleet.jobs import plan_jobs
from cuvil.verify.fleet.spec import load_fleet
from tests.verify.fleet.fleet_models import edit_model, write_fleet

MINIMAL = """
[defaults]
targets = ["ref", "native"]
checks = ["compat"]

[[model]]
path = "models/*.onnx"        # relative to this file; globs allowed

[[model]]
path = "detector.onnx"
targets = ["native", "wasm32"]
"""


def _files(folder: Path, *names: str) -> None:
    for name in names:
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"model " + name.encode())


def test_the_minimal_form_of_the_issue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _files(tmp_path, "models/a.onnx", "models/b.onnx", "detector.onnx")
    (tmp_path / "fleet.toml").write_text(MINIMAL)
    monkeypatch.chdir("/")  # paths are relative to the file, not the working folder
    fleet = load_fleet(tmp_path / "fleet.toml")
    assert [(m.name, m.targets, m.checks) for m in fleet.models] == [
        ("models/a.onnx", ("ref", "native"), ("compat",)), ("models/b.onnx", ("ref", "native"), ("compat",)),
        ("detector.onnx", ("native", "wasm32"), ("compat",))]
    assert fleet.models[0].source == str((tmp_path / "models/a.onnx").resolve())
    assert fleet.job_count == 6 and len(plan_jobs(fleet)) == 6


def test_defaults_merge_with_each_model(tmp_path: Path) -> None:
    _files(tmp_path, "m.onnx", "nets.py", "baselines/m.json", "samples/m/0.npz", "cuvil.toml")
    (tmp_path / "fleet.toml").write_text("""
[defaults]
targets = "ref"
checks = ["compat", "layerwise"]
timeout = 30
memory = "2GiB"
config = "cuvil.toml"
[defaults.thresholds.precision]
max_rel_l2 = 1e-5
precisions = ["fp32"]

[[model]]
path = "m.onnx"
baseline = "baselines/{stem}.json"
inputs = "samples/{stem}"
faults = ["native-crash"]
[model.thresholds.precision]
max_rel_l2 = 1e-3

[[model]]
path = "nets.py:tiny"
name = "tiny net"
strict = true
seed = 3

[resources.native]
num_cpus = 2
""")
    m, f = load_fleet(tmp_path / "fleet.toml").models
    assert m.thresholds == {"precision": {"max_rel_l2": 1e-3, "precisions": ["fp32"]}}
    assert m.baseline == (tmp_path / "baselines/m.json").resolve() and m.inputs == (tmp_path / "samples/m").resolve()
    assert m.timeout == 30.0 and m.memory == 2 << 30 and m.faults == ("native-crash",) and m.checks == ("compat", "layerwise")
    assert f.name == "tiny net" and f.source == f"{(tmp_path / 'nets.py').resolve()}:tiny" and f.strict and f.seed == 3
    assert f.thresholds == {"precision": {"max_rel_l2": 1e-5, "precisions": ["fp32"]}} and f.faults == ()


@pytest.mark.parametrize("text, message", [
    ("[[model]]\npath = 'a.onnx'\ntargets = ['ref']\nchecks = ['compat']\ncolour = 1\n", "unknown keys colour"),
    ("[defaults]\ntargets = ['tpu']\nchecks = ['compat']\n[[model]]\npath = 'a.onnx'\n", "unknown target 'tpu'"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['nope']\n[[model]]\npath = 'a.onnx'\n", "unknown check or group 'nope'"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n[[model]]\npath = 'x/*.onnx'\n", "matches no file"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n[[model]]\npath = 'b.onnx'\n", "'b.onnx': no such file"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n[[model]]\npath = 'a.onnx'\n[[model]]\npath = '*.onnx'\n",
     "listed twice"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n[[model]]\npath = 'a.onnx'\nfaults = ['typo']\n",
     "unknown fault(s) typo"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n[[model]]\npath = 'a.onnx'\ntimeout = -1\n",
     "timeout must be a positive number"),
    ("[[model]]\npath = 'a.onnx'\n", "no targets or checks"),
    ("[defaults]\ntargets = ['ref']\nchecks = ['compat']\n", "no [[model]] entries"),
    ("[fleet]\n", "unknown top-level keys fleet"),
    ("[[model]\n", "not valid TOML"),
])
def test_bad_fleet_files_are_usage_errors_naming_the_entry(tmp_path: Path, text: str, message: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _files(tmp_path, "a.onnx")
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(VerifyError, match=None) as exc:
        load_fleet(path)
    assert message in str(exc.value) and str(path) in str(exc.value)
    assert main(["verify-fleet", str(path), "--report-dir", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran


def test_job_keys_change_with_what_decides_the_outcome_only(tmp_path: Path) -> None:
    fleet_file = write_fleet(tmp_path)
    first = {(j.model, j.target): j.key for j in plan_jobs(load_fleet(fleet_file))}
    assert len(set(first.values())) == len(first) == 12
    assert first == {(j.model, j.target): j.key for j in plan_jobs(load_fleet(fleet_file))}
    edit_model(tmp_path, "ok_relu")
    second = {(j.model, j.target): j.key for j in plan_jobs(load_fleet(fleet_file))}
    changed = {k for k in first if first[k] != second[k]}
    assert changed == {("models/ok_relu.onnx", "ref"), ("models/ok_relu.onnx", "native")}
    fleet_file.write_text(fleet_file.read_text().replace('precisions = ["fp32"]', 'precisions = ["fp32", "fp16"]'))
    third = {(j.model, j.target): j.key for j in plan_jobs(load_fleet(fleet_file))}
    assert not set(third.values()) & set(second.values())  # a default threshold is every job's setting


def test_command_line_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet_file = write_fleet(tmp_path)
    assert main(["verify-fleet", str(fleet_file), "--jobs", "0"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    assert main(["verify-fleet", str(fleet_file), "--ray-address", "auto"]) == 2
    assert "--ray-address applies with --executor ray" in capsys.readouterr().err
    assert main(["verify-fleet", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read the fleet file" in capsys.readouterr().err

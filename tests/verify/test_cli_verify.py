"""``cuvil verify`` on the command line: arguments, exit statuses and the report folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil.cli import main


def test_exit_0_when_everything_passes(test_checks: None, mlp: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = main(["verify", str(mlp), "--checks", "t-agree,t-warn", "--targets", "ref", "--report-dir", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.strip() == "PASS: 1 pass, 1 warn, 0 fail, 0 skip"
    assert "[1/2] t-agree on ref ..." in captured.err  # plain progress lines: stderr is not a terminal here
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["junit.xml", "report.html", "report.json",
                                                                     "summary.md"]
    data = json.loads((out / "report.json").read_text())
    assert [r["check"] for r in data["results"]] == ["t-agree", "t-warn"]


def test_exit_1_on_failure_or_strict_warning(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    assert main(["verify", str(mlp), "--checks", "t-warn", "--targets", "ref", "-q"]) == 0
    assert main(["verify", str(mlp), "--checks", "t-warn", "--targets", "ref", "-q", "--strict"]) == 1
    assert main(["verify", str(mlp), "--checks", "t-crash", "--targets", "ref", "-q"]) == 1
    cfg = tmp_path / "cuvil.toml"
    cfg.write_text('select = ["t-agree"]\ntargets = ["ref"]\n[checks.t-agree]\nrel_l2 = -1.0\n')
    assert main(["verify", str(mlp), "--config", str(cfg), "-q"]) == 1


def test_baseline_flags(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    base = tmp_path / "b.json"
    args = ["verify", str(mlp), "--checks", "t-figures", "--targets", "ref", "-q"]
    assert main([*args, "--save-baseline", str(base)]) == 0
    assert main([*args, "--baseline", str(base)]) == 0
    cfg = tmp_path / "cuvil.toml"
    cfg.write_text("[checks.t-figures]\nfigures = { median_ms = 9.0 }\n")
    assert main([*args, "--baseline", str(base), "--config", str(cfg)]) == 1


@pytest.mark.parametrize("argv, message", [
    (["--checks", "nope"], "unknown check or group 'nope'"),
    (["--targets", "tpu"], "unknown target 'tpu'"),
    (["--config", "/nonexistent/cuvil.toml"], "cannot read the config file"),
    (["--baseline", "/nonexistent/b.json"], "cannot read the baseline"),
    (["--subject", "tensorrt"], "unknown subject 'tensorrt'"),
])
def test_exit_2_on_usage_errors(test_checks: None, mlp: Path, argv: list[str], message: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(mlp), "--targets", "ref", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cuvil: error: ") and message in err


def test_exit_2_on_bad_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "m.py").write_text("def f():\n    raise RuntimeError('boom')\n")
    assert main(["verify", f"{tmp_path / 'm.py'}:f"]) == 2
    assert "f() failed: RuntimeError: boom" in capsys.readouterr().err


def test_help_and_argparse_errors_as_a_command(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "cuvil", "verify", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--save-baseline" in r.stdout and "exit status" in r.stdout
    r = subprocess.run([sys.executable, "-m", "cuvil", "verify"], capture_output=True, text=True)
    assert r.returncode == 2 and "MODEL" in r.stderr.upper()

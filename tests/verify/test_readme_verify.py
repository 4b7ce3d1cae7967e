"""The README's section on ``cuvil verify``: its commands and its Python block run as written,
from the repository root, and do what the section says they do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


TRANSFORMER = "### A real transformer, end to end"


def _section(title: str, end: str = "\n## ") -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(title):]
    stop = section.find(end, 1)
    return section if stop < 0 else section[:stop]


def test_readme_verify_section_runs(tmp_path: Path) -> None:
    section = _section("## Verifying a model before it ships").split(TRANSFORMER)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    (tmp_path / "cuvil").symlink_to(REPO / "cuvil")  # the commands' paths are relative to the repository root
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = [line for line in blocks[0][1].splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 5
    for command in commands:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=900)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
    report = json.loads((tmp_path / "reports" / "report.json").read_text(encoding="utf-8"))
    ran = {r["check"] for r in report["results"]}
    assert {"coverage", "passes", "fusion-memory", "layerwise", "latency", "concurrency"} <= ran
    assert all(r["status"] in ("pass", "skip", "warn") for r in report["results"])
    for name in ("junit.xml", "summary.md", "report.html"):
        assert (tmp_path / "reports" / name).is_file()
    assert (tmp_path / "baseline.json").is_file()

    r = subprocess.run([sys.executable, "-c", blocks[1][1]], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "0"
    assert any(line.startswith("coverage native pass") for line in lines), r.stdout
    assert any(line.startswith("passes native pass") for line in lines), r.stdout


_STATUS_LINE = re.compile(r"^  (PASS|WARN|FAIL|SKIP) ([a-z0-9-]+)(?: \[([a-z0-9_-]+)\])?: ")


@pytest.mark.slow
def test_readme_transformer_example_runs_and_shows_its_own_output(tmp_path: Path) -> None:
    """The BERT example: exported with transformers, every check on ref and native passes (latency may warn
    about its spread on a busy machine), the output shown is that run's, and --inputs runs on the samples."""
    pytest.importorskip("transformers")
    blocks = re.findall(r"```(bash|python|toml|text)\n(.*?)```", _section(TRANSFORMER), re.S)
    assert [lang for lang, _ in blocks] == ["python", "toml", "bash", "text"]
    (tmp_path / "bert_example.py").write_text(blocks[0][1], encoding="utf-8")
    (tmp_path / "cuvil.toml").write_text(blocks[1][1], encoding="utf-8")
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    commands = [line.split("  #")[0] for line in blocks[2][1].splitlines() if line.strip()]
    assert len(commands) == 3 and "--inputs samples" in commands[2]
    runs = []
    for command in commands:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=1200)
        assert r.returncode == 0, f"{command}\n{r.stdout}\n{r.stderr}"
        runs.append(r)
    report = json.loads((tmp_path / "bert-report" / "report.json").read_text(encoding="utf-8"))
    got = {(r["check"], r["target"] or ""): r["status"] for r in report["results"]}
    assert not [k for k, v in got.items() if v == "fail"]
    assert all(v != "warn" or k[0] == "latency" for k, v in got.items()), got
    assert {r["check"] for r in report["results"] if r["status"] == "pass"} >= {
        "coverage", "precision", "reproducibility", "cross-target", "dynamic-shapes", "passes", "fusion-memory",
        "batch-scaling", "concurrency", "layerwise"}
    shown = {(m.group(2), m.group(3) or ""): m.group(1).lower()
             for m in map(_STATUS_LINE.match, blocks[3][1].splitlines()) if m}
    assert shown.keys() == got.keys()
    for key, status in shown.items():
        assert status == got[key] or (key[0] == "latency" and {status, got[key]} <= {"pass", "warn"}), key
    assert {d["symbol"]: d["sample"] for d in report["dims"]} == {"batch": 1, "sequence": 16}
    assert "input input_ids: range [0, 22] (user data)" in runs[2].stderr, runs[2].stderr

"""The README's section on ``cuvil verify``: its commands and its Python block run as written,
from the repository root, and do what the section says they do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(title):]
    end = section.find("\n## ", 1)
    return section if end < 0 else section[:end]


def test_readme_verify_section_runs(tmp_path: Path) -> None:
    blocks = re.findall(r"```(bash|python)\n(.*?)```", _section("## Verifying a model before it ships"), re.S)
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

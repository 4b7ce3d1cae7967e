"""Smoke runs of the benchmark scripts (``benchmarks/``), so that they cannot rot.

Each script runs in a subprocess with ``--quick`` (one small model or two small GEMMs, a few
rounds) and writes its figures as JSON; the test checks that every runtime produced a timing,
that the outputs agreed with their oracle, and that the derived figures are consistent.  The
speeds themselves are not asserted: this machine is shared and the numbers are the benchmark's
business, not a test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")


def run_script(name: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True,
                          timeout=240, cwd=ROOT)
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_zoo_quick(tmp_path: Path) -> None:
    report = tmp_path / "zoo.json"
    run_script("zoo.py", "--quick", "--workdir", str(tmp_path / "work"), "--json", str(report))
    data = json.loads(report.read_text())
    (row,) = data["rows"]
    assert (row["model"], row["batch"], row["threads"]) == ("mlp", 1, 1)
    assert row["rounds"] >= 3
    for rt in ("cuvil", "onnxruntime", "eager", "torch.compile"):
        t = row["timings"][rt]
        assert t["error"] is None, f"{rt}: {t['error']}"
        assert 0 < t["median_ms"] <= t["p90_ms"]
        # fp32 MLP against onnxruntime: summation order is the only difference
        assert t["rel_l2"] <= 1e-5, f"{rt}: relative L2 {t['rel_l2']} against onnxruntime"
    (c,) = data["compile"]
    assert c["cuvil_cold_s"] > 0 and c["cuvil_cached_s"] > 0 and c["torch_compile_s"] > 0
    per = data["memory_kb"]["mlp b1"]
    for rt in ("cuvil", "onnxruntime", "eager", "torch.compile"):
        assert "error" not in per[rt], f"{rt}: {per[rt]}"
        # loading the MLP's 7.4 MB of weights must show in the high-water mark
        assert per[rt]["hwm_kb"] - per[rt]["base_kb"] > 7_000, per[rt]


def test_gemm_peak_quick(tmp_path: Path) -> None:
    report = tmp_path / "gemm.json"
    run_script("gemm_peak.py", "--quick", "--threads", "1", "--json", str(report))
    rows = json.loads(report.read_text())["rows"]
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(256, 256, 256), (128, 768, 768)]
    for r in rows:
        assert r["rel_l2"] <= 1e-5
        assert r["peak_gflops"] == max(r["peaks"].values()) > 0
        assert r["cuvil"] > 0 and r["torch.mm"] > 0


def test_pipeline_quick(tmp_path: Path) -> None:
    from cuvil.passes import default_pipeline, parse_pipeline

    report = tmp_path / "pipeline.json"
    run_script("pipeline.py", "--quick", "--workdir", str(tmp_path / "work"), "--json", str(report))
    data = json.loads(report.read_text())
    assert data["goals"] == {"pass_rel_l2": 1e-6, "ort_rel_l2": 1e-5, "plan_ratio": 1.1}
    rows = data["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("mlp", 1), ("cifar_cnn", 1)]
    names = [p.name for p in parse_pipeline(default_pipeline("native"))]
    for r in rows:
        where = f"{r['model']} b{r['batch']}"
        assert r["error"] is None, f"{where}: {r['error']}"
        assert r["passes_run"] == len(names) and [p["name"] for p in r["per_pass"]] == names, where
        errors = [p["error"] for p in r["per_pass"]]
        # every pass measured: a number, not None (not measured) nor "inf"/"nan" (an output broke)
        assert all(isinstance(e, float) and 0.0 <= e < float("inf") for e in errors), (where, errors)
        assert r["worst_pass_error"] == max(errors), where
        assert r["passes_ok"] == (max(errors) <= 1e-6), where
        assert isinstance(r["ort_rel_l2"], float) and 0.0 <= r["ort_rel_l2"] < float("inf"), where
        # no placement uses less than the bytes live at one node
        assert 0 < r["lower_bound_bytes"] <= r["arena_bytes"], where
        assert r["plan_ratio"] == pytest.approx(r["arena_bytes"] / r["lower_bound_bytes"]), where
        # both small fp32 models meet the goals: summation order is the only difference from onnxruntime
        assert r["misses"] == [], f"{where}: {r['misses']}"


def test_zoo_quick_from_torch_export(tmp_path: Path) -> None:
    """``--frontend torch``: Cuvil compiles torch.export's program; its outputs still match onnxruntime's."""
    report = tmp_path / "zoo.json"
    run_script("zoo.py", "--quick", "--frontend", "torch", "--no-torch-compile", "--no-memory", "--workdir",
               str(tmp_path / "work"), "--json", str(report))
    data = json.loads(report.read_text())
    assert any("torch.export" in line for line in data["machine"])
    (row,) = data["rows"]
    t = row["timings"]["cuvil"]
    assert t["error"] is None and 0 < t["median_ms"] <= t["p90_ms"]
    assert t["rel_l2"] <= 1e-5, f"relative L2 {t['rel_l2']} against onnxruntime"


@pytest.mark.slow
def test_fuzz_quick(tmp_path: Path) -> None:
    out = run_script("fuzz.py", "--quick", "--out", str(tmp_path / "findings"))
    assert '"compile-ref"' in out and "0 bad outcome(s)" in out, out


def test_corpus_quick(tmp_path: Path) -> None:
    """``corpus.py --quick`` on the MLP: the CPU line, a Cuvil / best peer ratio and no mismatch flag."""
    report = tmp_path / "corpus.json"
    out = run_script("corpus.py", "--quick", "--models", "mlp", "--json", str(report))
    assert out.startswith("cpu: ") and "avx512 flags:" in out.splitlines()[0], out
    assert "ratio batch  1, 1 thread : " in out and "MISMATCH" not in out, out
    (row,) = json.loads(report.read_text())["rows"]
    t = row["timings"]["cuvil"]
    assert t["error"] is None and t["median_ms"] > 0 and t["rel_l2"] <= 1e-5

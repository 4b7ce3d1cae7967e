"""Baselines: saving figures, comparing with margins and directions, failing on regressions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cuvil.verify import verify
from cuvil.verify.base import CheckResult, Status, VerifyError
from cuvil.verify.baseline import compare, compare_figure, load_baseline, save_baseline
from cuvil.verify.config import BaselineConfig, Margin, parse_config
from cuvil.verify.report import Report


def report(figures: dict[str, float], check: str = "latency") -> Report:
    return Report("m", ["native"], [check], [CheckResult(check, Status.PASS, "ok", target="native", figures=figures)])


def test_compare_figure_directions_and_margins() -> None:
    m = Margin(relative=0.1, absolute=0.0)
    assert compare_figure(1.0, 1.05, m, False)[0] == "ok"
    assert compare_figure(1.0, 1.2, m, False)[0] == "regressed"
    assert compare_figure(1.0, 0.5, m, False)[0] == "improved"
    assert compare_figure(100.0, 80.0, m, True)[0] == "regressed"  # throughput fell by 20 %
    assert compare_figure(0.0, 1e-9, m, False)[0] == "regressed"
    assert compare_figure(0.0, 1e-9, Margin(0.1, 1e-8), False)[0] == "ok"
    assert compare_figure(1.0, math.nan, m, False)[0] == "regressed"
    assert compare_figure(math.nan, math.nan, m, False)[0] == "ok"


def test_save_load_and_compare(tmp_path: Path) -> None:
    path = save_baseline(report({"median_ms": 1.0, "throughput": 100.0, "max_rel_l2": float("nan")}), tmp_path / "b.json")
    json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    base = load_baseline(path)
    assert base.figures[("latency", "native")]["median_ms"] == 1.0
    assert math.isnan(base.figures[("latency", "native")]["max_rel_l2"])
    cfg = BaselineConfig()
    (same,) = compare(report({"median_ms": 1.05, "throughput": 95.0, "max_rel_l2": float("nan")}), base, cfg)
    assert same.status is Status.PASS and same.figures["compared"] == 3
    (worse,) = compare(report({"median_ms": 1.5, "throughput": 50.0, "max_rel_l2": float("nan")}), base, cfg)
    assert worse.status is Status.FAIL and worse.figures["regressed"] == 2
    assert worse.where["figure"] == "latency.median_ms" or worse.where["figure"] == "latency.throughput"
    assert "latency.median_ms 1 -> 1.5" in worse.summary
    loose = parse_config({"baseline": {"figures": {"latency.median_ms": 0.6, "*.throughput": {"relative": 0.6}}}})
    (ok,) = compare(report({"median_ms": 1.5, "throughput": 50.0, "max_rel_l2": float("nan")}), base, loose.baseline)
    assert ok.status is Status.PASS


def test_missing_figures_warn_and_checks_not_run_are_ignored(tmp_path: Path) -> None:
    base = load_baseline(save_baseline(report({"median_ms": 1.0, "p99_ms": 2.0}), tmp_path / "b.json"))
    (r,) = compare(report({"median_ms": 1.0}), base, BaselineConfig())
    assert r.status is Status.WARN and r.details["missing"] == ["latency.p99_ms"]
    assert compare(report({"x": 1.0}, check="other"), base, BaselineConfig()) == []


def test_a_report_json_is_a_baseline_too(tmp_path: Path) -> None:
    from cuvil.verify.render.json import write_json

    p = write_json(report({"median_ms": 2.0}), tmp_path / "report.json")
    assert load_baseline(p).figures[("latency", "native")] == {"median_ms": 2.0}
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(VerifyError, match="not a baseline"):
        load_baseline(tmp_path / "bad.json")


def test_verify_with_baseline_end_to_end(test_checks: None, mlp: Path, tmp_path: Path) -> None:
    fast = {"checks": {"t-figures": {"figures": {"median_ms": 1.0, "arena_bytes": 4096}}}}
    first = verify(str(mlp), checks=["t-figures"], targets=["ref"], config=fast,
                         save_baseline=tmp_path / "base.json")
    assert first.exit_status == 0 and (tmp_path / "base.json").is_file()
    again = verify(str(mlp), checks=["t-figures"], targets=["ref"], config=fast, baseline=tmp_path / "base.json")
    assert again.get("baseline", "ref")[0].status is Status.PASS and again.exit_status == 0
    slow = {"checks": {"t-figures": {"figures": {"median_ms": 1.3, "arena_bytes": 4096}}}}
    worse = verify(str(mlp), checks=["t-figures"], targets=["ref"], config=slow, baseline=tmp_path / "base.json")
    (b,) = worse.get("baseline", "ref")
    assert b.status is Status.FAIL and b.where == {"check": "t-figures", "figure": "t-figures.median_ms"}
    assert worse.exit_status == 1
    margin = {**slow, "baseline": {"figures": {"t-figures.median_ms": 0.5}}}
    assert verify(str(mlp), checks=["t-figures"], targets=["ref"], config=margin,
                        baseline=tmp_path / "base.json").exit_status == 0

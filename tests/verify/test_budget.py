"""The whole suite, end to end: every registered check on a small PyTorch model, and what makes
``cuvil verify`` fast enough (one import, builds shared and started ahead, timings in the report).

Also ``batch-scaling`` under ``--subject onnxruntime``: its memory figures are measured, not
taken from Cuvil's plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import cuvil
from cuvil.cli import main
from cuvil.errors import CuvilError
from cuvil.verify.base import Status, all_checks
from cuvil.verify.context import ModelSource, VerifyContext
from cuvil.verify.runner import GROUP_ORDER
from tests.support.paths import REPO

TINY_CNN = REPO / "cuvil" / "examples" / "tiny_cnn.onnx"

FACTORY = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3)))


def make():
    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-0.2, 0.2)
        net.bn.running_var.uniform_(0.5, 1.5)
    batch = torch.export.Dim("batch", min=1, max=4)
    return net, [torch.randn(2, 3, 8, 8)], {"x": {0: batch}}
'''

FAST = """
[checks.latency]
min_runs = 3
min_seconds = 0.01
[checks.batch-scaling]
min_runs = 2
min_seconds = 0.01
[checks.concurrency]
repeats = 2
"""


@pytest.mark.slow  # every check on a model, each of its builds: about a minute
def test_every_check_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    import cuvil.frontends.torch as frontend

    (tmp_path / "net.py").write_text(FACTORY)
    (tmp_path / "cuvil.toml").write_text(FAST)
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    exports = []
    real = frontend.load_torch

    def counting(*args: Any, **kwargs: Any) -> Any:
        exports.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(frontend, "load_torch", counting)
    out = tmp_path / "report"
    code = main(["verify", f"{tmp_path / 'net.py'}:make", "--targets", "ref,native", "--config",
                 str(tmp_path / "cuvil.toml"), "--report-dir", str(out)])
    captured = capsys.readouterr()
    data = json.loads((out / "report.json").read_text())
    bad = [(r["check"], r["target"], r["summary"]) for r in data["results"] if r["status"] == "fail"]
    assert code == 0 and not bad, bad
    # every registered check ran (or said why not), with results for both targets where it is per target
    checks = list(all_checks())
    assert sorted(data["checks"]) == sorted(checks)
    assert {r["check"] for r in data["results"]} == set(checks)
    assert all(r["status"] in ("pass", "warn", "skip") for r in data["results"])
    ran = {r["check"] for r in data["results"] if r["status"] != "skip"}
    assert {"coverage", "precision", "cross-target", "passes", "fusion-memory", "layerwise", "latency",
            "batch-scaling", "concurrency", "dynamic-shapes"} <= ran, ran
    # "all" runs the groups in order: static checks first, the ones that time builds last
    groups = [all_checks()[c].group for c in data["checks"]]
    assert groups == sorted(groups, key=GROUP_ORDER.index)
    # the module is exported once for every check (coverage reads the mapping log of that import)
    assert len(exports) == 1
    # where the time went: a wall time per check, and every build made once, by the check that asked first
    timings = data["timings"]
    assert [t["check"] for t in timings] == data["checks"]
    assert all(t["seconds"] >= 0 for t in timings)
    made = [(b["target"], json.dumps(b["options"], sort_keys=True)) for t in timings for b in t["builds"]]
    assert len(made) == len(set(made)) and ("native", "{}") in made
    fm = next(t for t in timings if t["check"] == "fusion-memory")
    assert sum(t["build_seconds"] for t in timings) > 0 and fm["seconds"] >= 0
    assert "PASS" in captured.out


@pytest.fixture
def ctx(tmp_path: Path) -> VerifyContext:
    return VerifyContext(ModelSource("onnx", str(TINY_CNN)), ["ref", "native"], work_dir=tmp_path,
                         cache_dir=str(tmp_path / "cache"))


def test_prefetched_builds_are_shared_and_fail_like_direct_ones(ctx: VerifyContext) -> None:
    ctx.prefetch([("native", {}), ("native", {}), ("native", {"passes": "no-such-pass"})])
    m = ctx.compiled("native")
    assert ctx.compiled("native") is m
    (entry,) = ctx.builds
    assert entry["target"] == "native" and entry["background"] and entry["seconds"] > 0
    with pytest.raises(CuvilError, match="no-such-pass") as background:
        ctx.compiled("native", passes="no-such-pass")
    with pytest.raises(type(background.value), match="no-such-pass"):
        cuvil.compile(str(TINY_CNN), target="native", passes="no-such-pass", cache_dir=ctx.cache_dir)
    ctx.close()
    # the same outputs as a build made on this thread
    x = ctx.inputs()
    direct = cuvil.compile(str(TINY_CNN), target="native", cache_dir=ctx.cache_dir)
    assert all((a == b).all() for a, b in zip(m(*x), direct(*x)))


def test_batch_scaling_measures_onnxruntime_memory(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    report = cuvil.verify(str(TINY_CNN), subject="onnxruntime", checks=["batch-scaling"], work_dir=tmp_path,
                          config={"checks": {"batch-scaling": {"max_batch": 8, "min_runs": 2,
                                                               "min_seconds": 0.01}}})
    (r,) = report.results
    assert r.status is Status.PASS, r.summary
    assert r.details["memory_source"].startswith("measured: onnxruntime is not a Cuvil build")
    rows = r.details["series"]
    assert [row["batch"] for row in rows] == [1, 2, 4, 8]
    for row in rows:
        # measured, not Cuvil's plan: no arena, no liveness figures
        assert row["peak_rss_delta_bytes"] > 0 and row["peak_bytes"] == row["peak_rss_delta_bytes"]
        assert row["arena_bytes"] is None and row["peak_live_bytes"] is None and row["allocated_bytes"] is None
    # 8 images of 3x32x32 need more working memory than one
    assert rows[-1]["peak_rss_delta_bytes"] > rows[0]["peak_rss_delta_bytes"]
    assert r.figures["peak_rss_delta_bytes_at_max"] == rows[-1]["peak_rss_delta_bytes"]
    assert "peak_live_bytes_at_max" not in r.figures
    assert "not a Cuvil memory plan" in r.details["fragmentation_note"]

"""The torch converter's op-mapping table: one record per converted FX node, returned as data on the
import, and read by the ``coverage`` check (which no longer depends on log records or log levels)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import cuvil.verify.checks  # noqa: F401  (registers the checks)
from cuvil.frontends.torch import OpMapping, load_torch
from cuvil.verify.base import Status, get_check
from cuvil.verify.context import ModelSource, VerifyContext


class ReluAddMatmul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w) + 1.0


def test_the_import_returns_one_mapping_per_converted_fx_node() -> None:
    imported = load_torch(ReluAddMatmul().eval(), (torch.randn(2, 8),))
    by_target = {m.aten: m for m in imported.mappings}
    assert all(isinstance(m, OpMapping) for m in imported.mappings)
    assert set(by_target) == {"aten.matmul.default", "aten.relu.default", "aten.add.Tensor"}
    assert by_target["aten.relu.default"].cuvil_ops == ("relu",)
    assert "matmul" in by_target["aten.matmul.default"].cuvil_ops
    assert by_target["aten.add.Tensor"].cuvil_ops[-1] == "add"
    # the records name the FX nodes the graph's nodes were named after, and the user's line of code
    names = {n.name for n in imported.graph.walk()}
    assert all(m.node in names for m in imported.mappings if m.cuvil_ops)
    assert all(m.location.startswith(f"{Path(__file__)}:") for m in imported.mappings)


def test_the_table_does_not_depend_on_the_log_level() -> None:
    log = logging.getLogger("cuvil.frontends.torch.converter")
    level = log.level
    log.setLevel(logging.CRITICAL)  # nothing is logged: the table is there all the same
    try:
        quiet = load_torch(ReluAddMatmul().eval(), (torch.randn(2, 8),)).mappings
    finally:
        log.setLevel(level)
    assert [m.aten for m in quiet] == ["aten.matmul.default", "aten.relu.default", "aten.add.Tensor"]


def test_coverage_reads_the_table(tmp_path: Path) -> None:
    ctx = VerifyContext(ModelSource("torch", ReluAddMatmul().eval(), (torch.randn(2, 8),)), targets=["ref"],
                        work_dir=tmp_path, config={})
    (result,) = get_check("coverage")().run(ctx)
    assert result.status is Status.PASS, result.summary
    rows = {r["source_op"]: r for r in result.details["ops"]}
    assert set(rows) == {"aten.matmul.default", "aten.relu.default", "aten.add.Tensor"}
    assert rows["aten.relu.default"]["cuvil_ops"] == ["relu"]
    assert [r["source_node"] for r in result.details["ops"]] == [m.node for m in ctx.torch_mappings]
    assert result.details["source"] == "the torch front end's op-mapping table (FX nodes)"


@pytest.mark.parametrize("level", [logging.DEBUG, logging.WARNING])
def test_the_debug_log_renders_the_same_records(level: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(level, logger="cuvil.frontends.torch.converter"):
        imported = load_torch(ReluAddMatmul().eval(), (torch.randn(2, 8),))
    logged = [r.getMessage() for r in caplog.records if r.name == "cuvil.frontends.torch.converter"]
    assert logged == ([m.describe() for m in imported.mappings] if level == logging.DEBUG else [])

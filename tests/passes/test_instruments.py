"""Pass instruments: verify-each, numeric-each, dump-ir, timing, and bisecting with the limit."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.metrics import relative_l2
from cuvil.passes import (
    DumpIR,
    Instrument,
    NumericEach,
    Pass,
    PassManager,
    PassRecord,
    PassResult,
    PipelineError,
    Timing,
    VerifyEach,
    instruments,
    register_pass,
)


@register_pass
@dataclass(frozen=True)
class _Perturb(Pass):
    """Scales every f32 constant by ``1 + delta``: a deliberately wrong pass (test only)."""

    name: ClassVar[str] = "test-perturb"
    delta: float = 1e-3

    def run(self, graph: Graph) -> PassResult:
        for n in graph.walk():
            if n.op == "constant" and n.attrs["value"].dtype == np.float32:
                n.attrs["value"] = (n.attrs["value"] * np.float32(1 + self.delta)).astype(np.float32)
        return PassResult(graph, True)


@register_pass
@dataclass(frozen=True)
class _DropFirstNode(Pass):
    """Removes the first non-constant node and leaves its readers dangling (test only)."""

    name: ClassVar[str] = "test-drop-node"

    def run(self, graph: Graph) -> PassResult:
        graph.nodes.remove(next(n for n in graph.nodes if n.op != "constant"))
        return PassResult(graph, True)


@register_pass
@dataclass(frozen=True)
class _Sleep(Pass):
    name: ClassVar[str] = "test-sleep"
    seconds: float = 0.05

    def run(self, graph: Graph) -> PassResult:
        time.sleep(self.seconds)
        return PassResult(graph, False)


MODEL = """graph main(%x: f32[batch, 4]) {
  symbol batch in 2..8
  %w = constant() {value = dense<f32[4]> [0.5, -1.0, 2.0, 0.25]} : f32[4]
  %b = constant() {value = dense<f32[4]> [1.0, 1.0, 1.0, 1.0]} : f32[4]
  %i = identity(%x) : f32[batch, 4]
  %m = mul(%i, %w) : f32[batch, 4]
  %m2 = mul(%i, %w) : f32[batch, 4]
  %a = add(%m, %b) : f32[batch, 4]
  %y = add(%a, %m2) : f32[batch, 4]
  %s = shape(%x) {start = 1} : i64[1]
  return %y, %s
}
"""


# ---- verify-each ---------------------------------------------------------------------------------------------------


def test_verify_each_names_the_pass_that_broke_the_ir() -> None:
    pm = PassManager("canonicalize,test-drop-node,dce", instruments=[VerifyEach()])
    with pytest.raises(PipelineError, match=r"pass #2 'test-drop-node' produced invalid IR: .*not defined") as info:
        pm.run(parse_graph(MODEL))
    report = info.value.report
    assert report is not None and [r.verified for r in report.records] == [True, False]


def test_verify_each_says_when_the_input_was_already_invalid() -> None:
    g = parse_graph(MODEL)
    g.nodes.pop(2)  # %i is gone: its readers dangle before any pass
    with pytest.raises(PipelineError, match="input is invalid IR, before any pass ran"):
        PassManager("dce", instruments=[VerifyEach()]).run(g)


# ---- numeric-each --------------------------------------------------------------------------------------------------


def test_numeric_each_records_exact_passes_as_zero_and_finds_the_wrong_one() -> None:
    pm = PassManager("canonicalize,fold-constants,test-perturb,cse,dce", instruments=[NumericEach(seed=0)])
    pm.run(parse_graph(MODEL))
    report = pm.report
    assert report is not None
    errors = {r.name: r.errors for r in report.records}
    assert errors["canonicalize"] == {"y": 0.0, "s": 0.0}
    assert errors["fold-constants"] == {"y": 0.0, "s": 0.0}
    perturbed = errors["test-perturb"]
    assert perturbed is not None and 5e-4 < perturbed["y"] < 2e-3 and perturbed["s"] == 0.0
    assert errors["cse"] == {"y": 0.0, "s": 0.0}
    last = report.records[-1]
    assert last.total_errors is not None and last.total_errors["y"] == pytest.approx(perturbed["y"], rel=1e-6)
    bad = report.first_error_above(1e-6)
    assert bad is not None and bad.index == 3


def test_numeric_each_with_a_tolerance_stops_at_the_pass() -> None:
    pm = PassManager("canonicalize,test-perturb{delta=0.01},dce", instruments=[NumericEach(tolerance=1e-6)])
    with pytest.raises(PipelineError, match=r"pass #2 'test-perturb\{delta=0.01\}' changed the outputs"):
        pm.run(parse_graph(MODEL))


def test_numeric_each_uses_given_inputs_and_symbol_values() -> None:
    x = np.ones((5, 4), np.float32)
    seen: list[tuple[int, ...]] = []

    class Shapes(Instrument):
        def after_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
            seen.append(tuple(numeric._feeds[0].shape))

    numeric = NumericEach(inputs=[x])
    PassManager("canonicalize", instruments=[numeric, Shapes()]).run(parse_graph(MODEL))
    numeric2 = NumericEach(dims={"batch": 7})
    PassManager("canonicalize", instruments=[numeric2]).run(parse_graph(MODEL))
    assert seen == [(5, 4)] and numeric2._feeds[0].shape == (7, 4)


def test_numeric_each_notes_a_graph_it_cannot_run() -> None:
    text = """graph main(%x: f32[3]) {
  %i = constant() {value = dense<i64[1]> [7]} : i64[1]
  %y = gather(%x, %i) : f32[1]
  %z = identity(%y) : f32[1]
  return %z
}
"""
    pm = PassManager("canonicalize", instruments=[NumericEach()])
    pm.run(parse_graph(text))
    assert pm.report is not None
    assert "cannot run the input graph" in pm.report.notes[0]
    assert pm.report.records[0].errors is None and pm.report.records[0].notes == ["not measured"]


def test_numeric_each_draws_token_ids_within_their_table() -> None:
    # the ids index a table of 2 rows: ids drawn from the default integer range would stop the interpreter
    text = """graph main(%ids: i64[4]) {
  %t = constant() {value = dense<f32[2, 3]> [1, 2, 3, 4, 5, 6]} : f32[2, 3]
  %y = gather(%t, %ids) : f32[4, 3]
  %z = identity(%y) : f32[4, 3]
  return %z
}
"""
    numeric = NumericEach(seed=0)
    pm = PassManager("canonicalize", instruments=[numeric])
    pm.run(parse_graph(text))
    assert pm.report is not None and not pm.report.notes, pm.report.notes
    assert pm.report.records[0].errors == {"z": 0.0}
    (ids,) = numeric._feeds
    assert ids.min() >= 0 and ids.max() <= 1


# ---- dump-ir, timing -----------------------------------------------------------------------------------------------


def test_dump_ir_writes_numbered_parsable_dumps(tmp_path: Path) -> None:
    out = tmp_path / "dumps"
    out.mkdir()
    (out / "009-stale.cir").write_text("old run")
    (out / "notes.txt").write_text("mine")
    pm = PassManager("canonicalize,cse,dce", instruments=[DumpIR(out)], limit=2)
    g = pm.run(parse_graph(MODEL))
    names = sorted(p.name for p in out.iterdir())
    assert names == ["000-input.cir", "001-canonicalize.cir", "002-cse.cir", "notes.txt"]
    assert parse_graph((out / "000-input.cir").read_text()) is not None
    assert (out / "002-cse.cir").read_text() == print_graph(g)
    assert pm.report is not None and pm.report.records[1].dump == str(out / "002-cse.cir")


def test_timing_counts_the_pass_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Clock:
        """perf_counter and sleep on a clock only sleeping moves: what Timing reads is exact."""

        now = 0.0

        def perf_counter(self) -> float:
            return self.now

        def sleep(self, seconds: float) -> None:
            self.now += seconds

    clock = Clock()
    monkeypatch.setattr(instruments, "time", clock)  # what Timing reads
    monkeypatch.setattr(sys.modules[__name__], "time", clock)  # what test-sleep and Slow sleep on

    class Slow(Instrument):
        def before_pass(self, p: Pass, graph: Graph, record: PassRecord) -> None:
            time.sleep(0.5)

    pm = PassManager("test-sleep{seconds=0.05}", instruments=[Timing(), Slow()])
    pm.run(parse_graph(MODEL))
    assert pm.report is not None
    # the pass's 0.05 s, not the 0.5 s the other instrument slept
    assert pm.report.records[0].seconds == pytest.approx(0.05)


def test_bisecting_with_the_limit_pins_the_pass() -> None:
    """What `--passes-limit N` is for: the smallest N whose output is wrong names the pass."""
    pipeline = "canonicalize,fold-constants,cse,test-perturb,dce"
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)

    def output(limit: int) -> np.ndarray:
        from cuvil.backends.ref.interpreter import run_graph

        g = PassManager(pipeline, limit=limit).run(parse_graph(MODEL))
        return run_graph(g, [x])[0]

    reference = output(0)
    first_bad = next(n for n in range(1, 6) if relative_l2(output(n), reference) > 1e-6)
    assert first_bad == 4


@pytest.mark.parametrize("order", ["verify-first", "dump-first"])
def test_broken_ir_is_dumped_whatever_the_instrument_order(tmp_path: Path, order: str) -> None:
    verify, dump = VerifyEach(), DumpIR(tmp_path)
    instruments: list[Instrument] = [verify, dump] if order == "verify-first" else [dump, verify]
    with pytest.raises(PipelineError, match="produced invalid IR"):
        PassManager("test-drop-node", instruments=[*instruments, NumericEach()]).run(parse_graph(MODEL))
    assert (tmp_path / "001-test-drop-node.cir").is_file()

"""Memory-planned C builds: one arena per call, checked against the reference interpreter and
against unplanned builds (which must agree bit for bit), with the arena poisoned so that any
read of stale or unwritten memory shows; and the planted planner faults that poison reveals."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.c.codegen import CodegenError, CodegenOptions, generate
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.passes import PassManager
from cuvil.verify.checks.batch_scaling import memory_figures

GOLDEN = Path(__file__).parents[2] / "passes" / "golden_plan"
POISON = "plan-memory{poison=true}"


def graph(case: str, drop_symbol: bool = False) -> Graph:
    text = (GOLDEN / f"{case}.cir").read_text(encoding="utf-8")
    return parse_graph(text.replace("  symbol batch in 1..8\n", "") if drop_symbol else text)


def build(g: Graph, tmp_path: Path, passes: str, target: str = "native") -> cuvil.CompiledModel:
    return cuvil.compile(g, target, passes=passes, cache_dir=str(tmp_path))


def inputs(g: Graph, batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        shape = [batch if not isinstance(d, int) else d for d in v.type.shape]
        out.append(rng.standard_normal(shape).astype(np.float32) if v.type.dtype.is_float
                   else np.asarray(rng.random() < 0.5))
    return out


def agree(a: list[np.ndarray], b: list[np.ndarray], rtol: float = 1e-5) -> bool:
    return all(x.shape == y.shape and np.allclose(x, y, rtol=rtol, atol=1e-6) for x, y in zip(a, b))


@pytest.mark.parametrize("case", ["residual", "symbolic", "region"])
def test_poisoned_arena_matches_unplanned_bitwise_and_the_reference(case: str, tmp_path: Path) -> None:
    g = graph(case)
    ref = cuvil.compile(g, "ref")
    planned = build(g, tmp_path, POISON)
    unplanned = build(g, tmp_path, "")
    assert planned.memory_plan is not None and planned.memory_plan.poison and unplanned.memory_plan is None
    for batch in (1, 3, 8, 2):  # the model's kept arena: reused, outgrown, then larger than needed
        for seed in (0, 1):
            xs = inputs(g, batch, seed)
            got = planned(*xs)
            assert all(np.array_equal(a, b) for a, b in zip(got, unplanned(*xs)))
            assert agree(got, ref(*xs))


def test_generated_c_uses_one_uninitialised_arena(tmp_path: Path) -> None:
    g = PassManager("plan-memory").run(graph("residual"))
    src = generate(g, CodegenOptions(target="generic")).source
    assert src.count("cuvil_arena_get(call, m->shared, arena_bytes") == 1  # lent by the model, kept between calls
    assert "const int64_t arena_bytes0 = 768;" in src
    assert src.count("cuvil_alloc(call") == 1  # every intermediate is planned: only the graph output is not
    assert "memset(arena0" not in src  # poison is opt-in
    # add and relu run in place: their loops drop restrict; the softmax's does not need to
    body = src[src.index("node 'add'") if "node 'add'" in src else src.index("= add("):]
    assert "*restrict" not in body.split("/* node")[0]
    poisoned = generate(PassManager(POISON).run(graph("residual")), CodegenOptions(target="generic")).source
    assert poisoned.count("memset(arena0") == 1 + len(g.memory_plan.buffers)


def test_symbol_without_maximum_runs_beyond_the_planned_values(tmp_path: Path) -> None:
    g = graph("symbolic", drop_symbol=True)
    m = build(g, tmp_path, POISON)
    assert m.memory_plan.representative == {"batch": 64}
    ref = cuvil.compile(g, "ref")
    for batch in (1, 100):
        xs = inputs(g, batch)
        assert agree(m(*xs), ref(*xs))


def test_concurrent_calls_each_own_their_arena(tmp_path: Path) -> None:
    g = graph("symbolic")
    m = build(g, tmp_path, "plan-memory")
    cases = [inputs(g, b, seed) for b, seed in ((1, 0), (8, 1), (3, 2), (8, 3))]
    expected = [m(*xs) for xs in cases]
    failures: list[int] = []

    def worker(k: int) -> None:
        for _ in range(50):
            if not all(np.array_equal(a, b) for a, b in zip(m(*cases[k]), expected[k])):
                failures.append(k)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("fault", ["arena-overlap", "stale-read"])
def test_planted_planner_faults_show_in_the_poisoned_build(fault: str, tmp_path: Path) -> None:
    g = graph("residual")
    xs = inputs(g, 1)
    expected = cuvil.compile(g, "ref")(*xs)  # the build without the fault agrees: the first test
    with cuvil.faults.plant(fault):
        bad = build(g, tmp_path, POISON)
    assert not agree(bad(*xs), expected)


def test_a_stale_plan_is_refused(tmp_path: Path) -> None:
    g = PassManager("plan-memory").run(graph("residual"))
    g.nodes.pop(-2)  # the plan was made for the graph before this change
    g.nodes[-1].inputs[0] = g.nodes[-2].outputs[0]
    with pytest.raises(CodegenError, match="stale"):
        generate(g, CodegenOptions(target="generic"))


def test_memory_figures_come_from_the_plan(tmp_path: Path) -> None:
    g = graph("symbolic")
    m = build(g, tmp_path, "plan-memory")
    f = memory_figures(m.graph, {"batch": 4})
    assert f["arena_bytes"] == m.memory_plan.arena_bytes({"batch": 4}) == 4 * 256
    assert f["arena_lower_bound_bytes"] == f["arena_bytes"] and f["fragmentation"] is not None
    assert f["largest_free_block"] is not None and f["largest_free_block"] <= f["arena_bytes"]
    assert f["allocated_bytes"] == f["arena_bytes"] + 4 * (32 + 1) * 4  # and the two outputs, each its own
    unplanned = memory_figures(graph("symbolic"), {"batch": 4})  # no plan: no arena figures
    assert unplanned["arena_bytes"] is None and unplanned["fragmentation"] is None



def test_hardmax_writes_every_element_of_arena_memory(tmp_path: Path) -> None:
    # hardmax's output in the poisoned arena: the zeros are written, not left to whatever the memory held
    g = parse_graph("""graph main(%x: f32[n, 4]) {
  symbol n in 1..4
  %h = hardmax(%x) : f32[n, 4]
  %r = reciprocal(%h) : f32[n, 4]
  %y = neg(%r) : f32[n, 4]
  return %y
}
""")
    x = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    with np.errstate(divide="ignore"):
        (want,) = cuvil.compile(g, "ref")(x)
    for target in ("generic", "native"):
        (got,) = build(g, tmp_path, POISON, target)(x)
        assert np.array_equal(got, want), (target, got, want)

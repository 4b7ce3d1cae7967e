"""The plan-memory pass and the planner behind it (cuvil/backends/c/memplan.py), without compiling C.

Golden plans: ``golden_plan/<case>.cir`` planned gives ``<case>.plan`` (rewrite with
``--update-golden`` after an intended change and review the diff).  Every plan is also checked
against its defining property: two values live at the same node never share a byte, at every
symbol value tried, and the arena is never below the lower bound.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

import cuvil.ops  # noqa: F401  (registers the op set)
from cuvil.backends.c.memplan import MemoryPlan, MemoryPlanError, plan_memory
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.verify import verify
from cuvil.passes import PassManager, default_pipeline, parse_pipeline
from cuvil.passes.plan_memory import PlanMemory
from cuvil.passes.rewrite import copy_graph

GOLDEN = Path(__file__).parent / "golden_plan"
CASES = sorted(GOLDEN.glob("*.cir"))


def _planned(text: str, pipeline: str = "plan-memory") -> Graph:
    g = parse_graph(text)
    verify(g)
    return PassManager(pipeline).run(g)


def assert_sound(plan: MemoryPlan, dims: dict[str, int] | None = None) -> None:
    """No two values whose lifetimes meet share a byte; every value fits its buffer; bound <= arena."""
    layout = plan.value_layout(dims)
    sizes = plan.buffer_sizes(dims)
    offs = plan.buffer_offsets(dims)
    arena = plan.arena_bytes(dims)
    for i, b in enumerate(plan.buffers):
        assert offs[i] % 64 == 0 and offs[i] + sizes[i] <= arena
        for k in b.values:
            assert layout[plan.values[k].name] == (offs[i], layout[plan.values[k].name][1])
            assert layout[plan.values[k].name][1] <= sizes[i]
    for (i, a), (j, b) in itertools.combinations(enumerate(plan.buffers), 2):
        if a.start <= b.end and b.start <= a.end and sizes[i] and sizes[j]:
            assert offs[i] + sizes[i] <= offs[j] or offs[j] + sizes[j] <= offs[i], (i, j)
    assert plan.lower_bound_bytes(dims) <= arena


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_plan_matches_golden(case: Path, update_golden: bool) -> None:
    g = _planned(case.read_text(encoding="utf-8"))
    plan = g.memory_plan
    assert isinstance(plan, MemoryPlan) and plan.values
    text = plan.format(None if plan.bounded else plan.representative)
    expected = case.with_suffix(".plan")
    if update_golden:
        expected.write_text(text, encoding="utf-8")
    assert expected.is_file(), f"{expected.name} is missing: run with --update-golden"
    assert text == expected.read_text(encoding="utf-8")
    for dims in ([None] if plan.is_static else [{s: v} for s in plan.symbols for v in (1, 2, 3, 7, 8)]):
        assert_sound(plan, dims)


def test_in_place_only_for_elementwise_kernels_over_dying_inputs() -> None:
    g = _planned((GOLDEN / "residual.cir").read_text(encoding="utf-8"))
    chains = {tuple(g.memory_plan.values[k].name for k in b.values) for b in g.memory_plan.buffers}
    # neg over a: a is read later (by d), so b gets its own buffer; softmax never works in place;
    # add writes over c (dying) and relu over d; the matmul output never shares its inputs' memory
    assert ("c", "d", "e") in chains and ("b",) in chains and ("m",) in chains
    off = _planned((GOLDEN / "residual.cir").read_text(encoding="utf-8"), "plan-memory{in-place=false}")
    assert all(len(b.values) == 1 for b in off.memory_plan.buffers)
    assert off.memory_plan.arena_bytes() >= g.memory_plan.arena_bytes()


def test_values_read_by_a_region_live_across_its_node() -> None:
    g = _planned((GOLDEN / "region.cir").read_text(encoding="utf-8"))
    plan = g.memory_plan
    a = next(v for v in plan.values if v.name == "a")
    assert (a.start, a.end) == (0, 2)  # read only inside the If's then-branch, at node 2
    assert {v.name for v in plan.values} == {"a", "b", "z"}  # not the If's result, not the graph output


def test_pipeline_text_default_pipeline_and_idempotence() -> None:
    (p,) = parse_pipeline("plan-memory{poison=true,in-place=false}")
    assert p == PlanMemory(in_place=False, poison=True) and str(p) == "plan-memory{in-place=false,poison=true}"
    for target in ("generic", "native", "wasm32"):
        assert default_pipeline(target).endswith(",plan-memory")
        assert default_pipeline(target, enable_fusion=False).endswith(",plan-memory")
    assert "plan-memory" not in default_pipeline("ref")
    g = parse_graph((GOLDEN / "residual.cir").read_text(encoding="utf-8"))
    assert PlanMemory().run(g).changed and not PlanMemory().run(g).changed
    assert PlanMemory(poison=True).run(g).changed


def test_copy_keeps_the_plan_and_a_changed_graph_is_refused() -> None:
    g = _planned((GOLDEN / "residual.cir").read_text(encoding="utf-8"))
    c = copy_graph(g)
    assert c.memory_plan is g.memory_plan
    c.memory_plan.check(c)
    c.nodes.pop(1)
    with pytest.raises(MemoryPlanError, match="stale"):
        c.memory_plan.check(c)


def test_figures_and_errors_for_symbolic_plans() -> None:
    text = (GOLDEN / "symbolic.cir").read_text(encoding="utf-8")
    plan = _planned(text).memory_plan
    assert not plan.is_static and plan.bounded
    assert plan.arena_bytes() == plan.arena_bytes({"batch": 8}) == 8 * plan.arena_bytes({"batch": 1})
    unbounded = _planned(text.replace("  symbol batch in 1..8\n", "")).memory_plan
    assert not unbounded.bounded and unbounded.representative == {"batch": 64}
    with pytest.raises(MemoryPlanError, match="no maximum"):
        unbounded.arena_bytes()
    assert unbounded.arena_bytes({"batch": 5}) == plan.arena_bytes({"batch": 5})
    with pytest.raises(MemoryPlanError, match="no symbol"):
        plan.arena_bytes({"height": 3})
    gaps = plan.free_blocks(0)  # at node 0 only a is live: everything else of the arena is free
    assert sum(s for _, s in gaps) == plan.arena_bytes() - 64 * 8
    assert 0.0 <= plan.fragmentation(0) <= 1.0 and plan.largest_free_block(0) == max(s for _, s in gaps)


_UNARY = ("exp", "neg", "relu", "sigmoid", "tanh")


def _random_graph(rng: random.Random, n: int) -> str:
    """A random DAG of elementwise ops, concats and softmaxes over f32[batch, k*16] values."""
    lines = ["graph main(%x: f32[batch, 16]) {", "  symbol batch in 1..16"]
    vals = [("x", 16)]
    for i in range(n):
        kind = rng.random()
        a_name, a_w = rng.choice(vals[-6:])
        if kind < 0.4:
            op = rng.choice(_UNARY)
            lines.append(f"  %v{i} = {op}(%{a_name}) : f32[batch, {a_w}]")
            vals.append((f"v{i}", a_w))
        elif kind < 0.6:
            same = [v for v in vals[-8:] if v[1] == a_w]
            b_name = rng.choice(same)[0]
            lines.append(f"  %v{i} = add(%{a_name}, %{b_name}) : f32[batch, {a_w}]")
            vals.append((f"v{i}", a_w))
        elif kind < 0.8 and a_w < 128:
            b_name, b_w = rng.choice(vals[-8:])
            lines.append(f"  %v{i} = concat(%{a_name}, %{b_name}) {{axis = 1}} : f32[batch, {a_w + b_w}]")
            vals.append((f"v{i}", a_w + b_w))
        else:
            lines.append(f"  %v{i} = softmax(%{a_name}) {{axis = 1}} : f32[batch, {a_w}]")
            vals.append((f"v{i}", a_w))
    outs = ", ".join(f"%{v}" for v, _ in vals[-2:])
    lines += [f"  return {outs}", "}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_are_planned_soundly_at_every_batch(seed: int) -> None:
    rng = random.Random(seed)
    g = parse_graph(_random_graph(rng, rng.randint(8, 40)))
    verify(g)
    plan = plan_memory(g)
    for b in (1, 2, 5, 16):
        assert_sound(plan, {"batch": b})
    # the greedy placement stays close to the bound it can never beat
    assert plan.arena_bytes() <= 1.5 * plan.lower_bound_bytes()

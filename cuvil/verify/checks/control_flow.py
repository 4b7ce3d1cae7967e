"""The ``control-flow`` check: inputs that drive every ``if`` branch and ``loop`` trip count, run on each target.

For a model with ``if`` / ``loop`` nodes (at any depth), the check searches for inputs that
cover each branch and each trip-count class, with a bounded budget (``budget``, default 48
candidate inputs), then runs every covering input on each target and compares it with the
reference interpreter.

1. Tracing: the reference interpreter runs each candidate with hooks that record which branch
   each ``if`` ran (``on_region``) and how many iterations each ``loop`` made (one per
   ``on_region`` call, closed when the loop node finishes).  Coverage items are
   ``(if, then|else)`` and ``(loop, 0|1|several)`` (several: 2 or more).
2. Candidates, in this order: the suite's seeded inputs; inputs set directly where a condition
   or trip count *is* a graph input (a condition true and false, a trip count 0, 1 and
   ``several``, default 3; a loop condition false); fills of the integer and boolean inputs a
   condition or trip count depends on (0, 1, ``several``, -1; all true, all false); the float
   inputs they depend on scaled by 0.1 and 10, negated and zeroed; then the same variants of
   every input, and fresh seeds.  A candidate is kept when it covers an item no kept one did;
   one the interpreter rejects is counted and dropped.
3. Each kept input runs on every target; an output differing from the reference (relative L2
   above ``max_rel_l2``, default 1e-5, for float outputs; any difference for others) fails the
   target.  The failure names the coverage item shared by every failing input and by no
   passing one (the ``if`` branch or loop trip class the bug hides behind), else the input.
4. Branches no candidate drove are a warning (never a failure), listed in the result; trip
   classes no candidate drove are listed too.  Loops whose trip count and condition depend on
   no input are reported as fixed, and their other trip classes are not searched for.
   A model without control flow is skipped with that reason.
5. A loop without a trip count (it runs until its body's condition says stop) or with a constant
   one of ``UNBOUNDED_TRIPS`` (2^31) or more is a warning: such a loop can run until the process
   is killed; the run options ``max_loop_iterations`` and ``max_output_bytes`` bound it
   (cuvil/limits.py).  A trip count read from a graph input is the caller's to bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.backends.ref.interpreter import run_graph
from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node, Value, reads
from cuvil.limits import RunLimits, applied
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.passes import output_errors

DEFAULT_BUDGET = 48
DEFAULT_MAX_REL_L2 = 1e-5
DEFAULT_SEVERAL = 3
UNBOUNDED_TRIPS = 1 << 31
# The reference runs of the candidate search stop a loop here (cuvil/limits.py).
SEARCH_LIMITS = RunLimits(max_loop_iterations=100_000)


def trip_class(n: int) -> str:
    return "0" if n == 0 else "1" if n == 1 else "several"


@dataclass
class Trace:
    """What one run of the reference interpreter did at the control-flow nodes."""

    items: set[tuple[str, str]] = field(default_factory=set)  # (node, "then"/"else"/"0"/"1"/"several")
    trips: dict[str, list[int]] = field(default_factory=dict)


def control_nodes(graph: Graph) -> list[Node]:
    return [n for n in graph.walk() if n.op in ("if", "loop")]


def node_names(nodes: Sequence[Node]) -> dict[int, str]:
    """A display name per node (its own, or ``op#k`` for an unnamed one), unique."""
    out: dict[int, str] = {}
    seen: set[str] = set()
    for k, n in enumerate(nodes):
        name = n.name or f"{n.op}#{k}"
        while name in seen:
            name += "'"
        seen.add(name)
        out[id(n)] = name
    return out


def traced_run(graph: Graph, inputs: Sequence[np.ndarray], names: dict[int, str]) -> tuple[list[np.ndarray], Trace]:
    """The reference outputs of ``graph`` on ``inputs``, and the branches and trip counts they took."""
    trace = Trace()
    iterations: dict[int, int] = {}

    def on_region(node: Node, region: Graph, _inputs: Sequence[np.ndarray | None]) -> None:
        if node.op == "if":
            trace.items.add((names[id(node)], "then" if region is node.attrs["then_branch"] else "else"))
        elif node.op == "loop":
            iterations[id(node)] = iterations.get(id(node), 0) + 1

    def on_node(node: Node, _outs: list[np.ndarray]) -> None:
        if node.op == "loop":
            n = iterations.pop(id(node), 0)
            trace.trips.setdefault(names[id(node)], []).append(n)
            trace.items.add((names[id(node)], trip_class(n)))

    outs = run_graph(graph, inputs, on_node=on_node, on_region=on_region)
    return [np.asarray(o) for o in outs], trace


def input_dependencies(graph: Graph) -> dict[Value, set[int]]:
    """For every value (nested ones included), the indices of the graph inputs it depends on."""
    index = {v: i for i, v in enumerate(graph.inputs)}
    owner: dict[Value, Node] = {}
    for n in graph.walk():
        for _, g in n.regions():
            for v in g.inputs:
                owner[v] = n
    memo: dict[Value, set[int]] = {}

    def deps(v: Value) -> set[int]:
        if v in memo:
            return memo[v]
        memo[v] = set()  # a value never depends on itself; this also ends loops through regions
        if v in index:
            out = {index[v]}
        elif v.producer is not None:
            out = set().union(*(deps(u) for u in reads(v.producer)))
        elif v in owner:
            out = set().union(*(deps(u) for u in reads(owner[v])))
        else:
            out = set()
        memo[v] = out
        return out

    for n in graph.walk():
        for u in [*n.inputs, *n.outputs]:
            if u is not None:
                deps(u)
    return memo


def unbounded_loops(nodes: Sequence[Node], names: dict[int, str]) -> list[str]:
    """The loops that may run without bound: no trip count, or a constant one of UNBOUNDED_TRIPS or more."""
    from cuvil.ops.common import const_of

    out = []
    for n in nodes:
        if n.op != "loop":
            continue
        m = n.inputs[0] if n.inputs else None
        if m is None:
            out.append(f"{names[id(n)]} (no trip count: it runs until its condition is false)")
            continue
        value = const_of(m)
        if value is not None and int(np.asarray(value).reshape(-1)[0]) >= UNBOUNDED_TRIPS:
            out.append(f"{names[id(n)]} (a trip count of {int(np.asarray(value).reshape(-1)[0])})")
    return out


def _controls(node: Node) -> list[Value]:
    """The values that decide a control node's path: an if's condition, a loop's trip count and condition."""
    return [v for v in node.inputs[: 1 if node.op == "if" else 2] if v is not None]


@dataclass
class _Search:
    """The candidate search: generates inputs, keeps those that add coverage."""

    graph: Graph
    base: list[np.ndarray]
    nodes: list[Node]
    several: int

    def direct(self) -> Iterator[tuple[str, list[np.ndarray]]]:
        """Inputs where a condition or trip count is itself a graph input, set to each useful value."""
        index = {v: i for i, v in enumerate(self.graph.inputs)}
        for node in self.nodes:
            for pos, v in enumerate(node.inputs[: 1 if node.op == "if" else 2]):
                if v is None or v not in index:
                    continue
                i = index[v]
                is_trips = node.op == "loop" and pos == 0
                values: list[Any] = [0, 1, self.several] if is_trips else [True, False]
                for val in values:
                    yield f"{v.name}={val}", self._with(i, np.full_like(self.base[i], val))

    def dependent(self, deps: dict[Value, set[int]]) -> Iterator[tuple[str, list[np.ndarray]]]:
        """Fills and variants of the inputs the control values depend on."""
        wanted = sorted(set().union(*(deps.get(v, set()) for n in self.nodes for v in _controls(n))))
        yield from self.variants(wanted)

    def variants(self, which: Sequence[int]) -> Iterator[tuple[str, list[np.ndarray]]]:
        for i in which:
            a = self.base[i]
            name = self.graph.inputs[i].name
            if a.dtype == np.bool_:
                yield f"{name}=all true", self._with(i, np.ones_like(a))
                yield f"{name}=all false", self._with(i, np.zeros_like(a))
            elif np.issubdtype(a.dtype, np.integer):
                fills = [0, 1, self.several] + ([-1] if np.issubdtype(a.dtype, np.signedinteger) else [])
                for val in fills:
                    yield f"{name}={val}", self._with(i, np.full_like(a, val))
            else:
                for label, b in (("*0.1", a * 0.1), ("*10", a * 10), ("negated", -a), ("zeros", np.zeros_like(a))):
                    yield f"{name}{label}", self._with(i, b.astype(a.dtype))

    def _with(self, i: int, a: np.ndarray) -> list[np.ndarray]:
        out = list(self.base)
        out[i] = a
        return out


@register_check
class ControlFlow(Check):
    """Inputs driving every if branch and loop trip count, compared with the reference on each target."""

    name = "control-flow"
    group = "ir-stability"
    description = "branch and trip-count coverage of If/Loop nodes, each covering input checked on every target"

    def run(self, ctx: Any) -> list[CheckResult]:
        t0 = time.perf_counter()
        cfg = self.settings(ctx)
        graph = ctx.graph
        nodes = control_nodes(graph)
        if not nodes:
            return [CheckResult(self.name, Status.SKIP, "the model has no if or loop node", target=t)
                    for t in ctx.targets]
        names = node_names(nodes)
        budget = int(cfg.get("budget", DEFAULT_BUDGET))
        several = int(cfg.get("several", DEFAULT_SEVERAL))
        max_rel = float(cfg.get("max_rel_l2", DEFAULT_MAX_REL_L2))
        kept, coverage, rejected, tried = self._search(ctx, graph, nodes, names, budget, several)
        search_seconds = time.perf_counter() - t0
        return [self._one(ctx, target, graph, nodes, names, kept, coverage, rejected, tried, max_rel, search_seconds)
                for target in ctx.targets]

    # ---- the search ----------------------------------------------------------------------------------------
    def _search(self, ctx: Any, graph: Graph, nodes: list[Node], names: dict[int, str], budget: int, several: int
                ) -> tuple[list[tuple[str, list[np.ndarray], list[np.ndarray], Trace]], dict[str, Any], list[str], int]:
        deps = input_dependencies(graph)
        fixed = self._fixed_loops(nodes, names, deps)
        wanted = self._wanted(nodes, names, set(fixed))
        base = ctx.inputs()
        search = _Search(graph, base, nodes, several)

        def candidates() -> Iterator[tuple[str, list[np.ndarray]]]:
            yield "seeded inputs", base
            yield from search.direct()
            yield from search.dependent(deps)
            yield from search.variants(range(len(base)))
            for k in range(1, budget):
                s = ctx.seed + k
                again = _Search(graph, ctx.inputs(seed=s), nodes, several)
                yield f"seed {s}", again.base
                yield from again.direct()

        kept: list[tuple[str, list[np.ndarray], list[np.ndarray], Trace]] = []
        covered: set[tuple[str, str]] = set()
        rejected: list[str] = []
        tried = 0
        for label, inputs in candidates():
            if tried >= budget or covered >= wanted:
                break
            tried += 1
            try:
                with applied(SEARCH_LIMITS):  # a candidate driving a loop without bound is dropped, not waited for
                    outs, trace = traced_run(graph, inputs, names)
            except CuvilError as exc:
                rejected.append(f"{label}: {exc}")
                continue
            if trace.items - covered:
                covered |= trace.items
                kept.append((label, inputs, outs, trace))
        coverage = {"wanted": sorted(wanted), "covered": sorted(covered), "missing": sorted(wanted - covered),
                    "fixed_loops": fixed}
        return kept, coverage, rejected, tried

    @staticmethod
    def _wanted(nodes: list[Node], names: dict[int, str], fixed: set[str]) -> set[tuple[str, str]]:
        """The coverage items to search for: both branches of every if, three trip classes of every loop
        whose trip count some input decides."""
        out: set[tuple[str, str]] = set()
        for n in nodes:
            if names[id(n)] in fixed:
                continue
            items = ("then", "else") if n.op == "if" else ("0", "1", "several")
            out |= {(names[id(n)], i) for i in items}
        return out

    @staticmethod
    def _fixed_loops(nodes: list[Node], names: dict[int, str], deps: dict[Value, set[int]]) -> list[str]:
        """Loops whose trip count and condition depend on no graph input (the body's condition included)."""
        fixed = []
        for n in nodes:
            if n.op != "loop":
                continue
            decide = _controls(n)
            if len(n.inputs) > 1 and n.inputs[1] is not None:  # the body's condition output then counts too
                decide.append(n.attrs["body"].outputs[0])
            if not any(deps.get(v) for v in decide):
                fixed.append(names[id(n)])
        return fixed

    # ---- one target ----------------------------------------------------------------------------------------
    def _one(self, ctx: Any, target: str, graph: Graph, nodes: list[Node], names: dict[int, str],
             kept: list[tuple[str, list[np.ndarray], list[np.ndarray], Trace]], coverage: dict[str, Any],
             rejected: list[str], tried: int, max_rel: float, search_seconds: float) -> CheckResult:
        out_names = [v.name for v in graph.outputs]
        ifs = [n for n in nodes if n.op == "if"]
        branches_total = 2 * len(ifs)
        if_names = {names[id(n)] for n in ifs}
        branches_hit = sum(1 for node, _ in coverage["covered"] if node in if_names)
        missing_branches = [f"{n} {b}" for n, b in coverage["missing"] if n in if_names]
        missing_trips = [f"{n} {c}" for n, c in coverage["missing"] if n not in if_names]
        runs: list[dict[str, Any]] = []
        failing: list[int] = []
        for k, (label, inputs, want, trace) in enumerate(kept):
            entry: dict[str, Any] = {"input": label, "covers": sorted(trace.items), "trips": trace.trips}
            if target != "ref":
                try:
                    got = [np.asarray(o) for o in ctx.compiled(target)(*inputs)]
                    errors = output_errors(got, want, out_names)
                    exact = {n: g.shape == w.shape and np.array_equal(g, w, equal_nan=True)
                             for n, g, w in zip(out_names, got, want)}
                    bad = [n for n, w in zip(out_names, want)
                           if not (errors[n] <= max_rel if w.dtype.kind == "f" else exact[n])]
                    entry.update(rel_l2=errors, wrong_outputs=bad)
                except CuvilError as exc:
                    bad = list(out_names)
                    entry.update(error=f"{type(exc).__name__}: {exc}", wrong_outputs=bad)
                if bad:
                    failing.append(k)
            runs.append(entry)
        figures = {"branches": float(branches_total), "branches_covered": float(branches_hit),
                   "branch_coverage": branches_hit / branches_total if branches_total else 1.0,
                   "inputs_tried": float(tried), "inputs_kept": float(len(kept)), "search_seconds": search_seconds}
        details: dict[str, Any] = {"coverage": coverage, "runs": runs, "rejected_inputs": rejected,
                                   "threshold": {"max_rel_l2": max_rel}, "missing_trip_counts": missing_trips}
        parts = [f"{branches_hit}/{branches_total} if branches"] if ifs else []
        if any(n.op == "loop" for n in nodes):
            parts.append(f"loop trip counts {self._trip_summary(kept, nodes, names)}")
        cover = ", ".join(parts)
        if failing:
            item = self._suspect(kept, failing)
            first = runs[failing[0]]
            where: dict[str, str] = {"input": str(first["input"])}
            if item is not None:
                node, what = item
                where = {"node": node, ("branch" if node in if_names else "trips"): what, "input": str(first["input"])}
                why = f"{'branch' if node in if_names else 'trip count'} {what} of {node!r}"
            else:
                why = f"input {first['input']!r}"
            summary = (f"{target} differs from the reference on {len(failing)} of {len(kept)} covering inputs "
                       f"(outputs {first['wrong_outputs']}); the failures follow {why} ({cover})")
            tensors = {}
            if "error" not in first:
                got = ctx.compiled(target)(*kept[failing[0]][1])
                tensors = {f"{n}.{target}": np.asarray(g) for n, g in zip(out_names, got) if n in first["wrong_outputs"]}
                tensors.update({f"{n}.reference": w for n, w in zip(out_names, kept[failing[0]][2])
                                if n in first["wrong_outputs"]})
            return CheckResult(self.name, Status.FAIL, summary, target=target, figures=figures, details=details,
                               where=where, tensors=tensors)
        unbounded = unbounded_loops(nodes, names)
        details["unbounded_loops"] = unbounded
        status = Status.WARN if missing_branches or unbounded else Status.PASS
        compared = "" if target == "ref" else f"; {len(kept)} covering inputs match the reference"
        summary = f"covers {cover}{compared}"
        if missing_branches:
            summary += f"; not reached: {', '.join(missing_branches)}"
        if unbounded:
            summary += (f"; may run without bound: {', '.join(unbounded)}; run it with max_loop_iterations "
                        "(and max_output_bytes) to bound it")
        where = {"node": missing_branches[0].rsplit(" ", 1)[0]} if missing_branches else {}
        if unbounded and not where:
            where = {"node": unbounded[0].split(" (", 1)[0]}
        return CheckResult(self.name, status, summary, target=target, figures=figures, details=details, where=where)

    @staticmethod
    def _trip_summary(kept: list[tuple[str, list[np.ndarray], list[np.ndarray], Trace]], nodes: list[Node],
                      names: dict[int, str]) -> str:
        parts = []
        for n in nodes:
            if n.op != "loop":
                continue
            name = names[id(n)]
            seen = sorted({c for *_, t in kept for c in t.trips.get(name, [])})
            parts.append(f"{name} {seen}")
        return "; ".join(parts)

    @staticmethod
    def _suspect(kept: list[tuple[str, list[np.ndarray], list[np.ndarray], Trace]], failing: list[int]
                 ) -> tuple[str, str] | None:
        """The coverage item every failing input took and no passing input did (the first in order)."""
        bad = [kept[k][3].items for k in failing]
        good = [t.items for k, (*_, t) in enumerate(kept) if k not in failing]
        common = set.intersection(*bad) - set().union(*good) if bad else set()
        if not common:
            return None
        order = [item for _, _, _, t in kept for item in sorted(t.items)]
        return min(common, key=order.index)

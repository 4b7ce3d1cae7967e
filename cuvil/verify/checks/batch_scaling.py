"""The ``batch-scaling`` check: throughput, latency and memory as the batch grows.

The batch is a symbolic dim (option ``symbol``; by default the symbol that is
dim 0 of the first input).  Sizes double from the smallest valid batch (a
multiple of the symbol's ``multiple_of``) while they stay within the symbol's
maximum, ``max_batch`` (default 64) and the memory limit (``memory_limit``,
bytes or ``"512M"``, default 1G); then the largest size under the limit is
found by bisection between the last size that fits and the first that does not.

At each size: median latency over a short measurement, throughput
(samples per second), and memory figures computed from the graph's shapes at
that size:

- ``peak_live_bytes``: the most bytes of top-level values alive at once, from
  the liveness of the values in the order the code runs them;
- ``input_bytes`` and ``weights_bytes``;
- with a memory plan (the ``plan-memory`` pass, in every default C pipeline):
  ``arena_bytes`` (the one allocation holding the planned intermediates),
  ``arena_lower_bound_bytes`` (the most planned bytes live at one node),
  ``largest_free_block`` and ``fragmentation`` (1 - largest free block / total
  free bytes of the arena, at the node with the most live bytes);
  ``allocated_bytes`` is then the arena plus every value allocated on its own
  (outputs, control-flow results, values sized only at run time), and
  ``peak_bytes`` the same sum, an upper bound of the peak;
- without a plan every value is its own allocation, freed after its last use:
  ``allocated_bytes`` is their sum, ``peak_bytes`` is ``peak_live_bytes`` and
  the arena figures are None.

A build that is not Cuvil's (the ``onnxruntime`` subject's session, which has a
``peak_memory`` method) allocates by its own rules, so the figures above that
come from Cuvil's graph or plan do not describe it: ``allocated_bytes``,
``peak_live_bytes`` and the arena figures are None (``details["memory_source"]``
says why), and ``peak_bytes`` is measured: ``peak_rss_delta_bytes``, the peak
resident set of one run minus the resident set before it, in a fresh process
per batch size with the session loaded (onnxruntime_subject.py).  The sizes
to try are still chosen by the graph's value liveness (``peak_live_bytes`` of
the imported graph, what any runtime holds live at once), as measuring every
bisection probe would take a process each; a size whose measured footprint
exceeds the limit is listed in ``details["over_limit"]`` and makes the result a
warning (the estimate let the sweep past the limit).

The batch sizes tried stop at the memory limit by ``peak_bytes + input_bytes +
weights_bytes``.  The knee is the first size after which
throughput improves by less than ``knee_gain`` (default 5%).

The check fails when a batched run disagrees with an unbatched one: the
first samples of each batch are also run on their own, at the smallest batch,
and each output whose dim 0 is the batch must agree within ``tolerance``
(relative L2, default 1e-5).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cuvil.ir.graph import Graph, Value
from cuvil.ir.symbolic import DimExpr, evaluate, is_unknown, sym
from cuvil.metrics import relative_l2
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.latency import measure

DEFAULTS: dict[str, Any] = {"max_batch": 64, "memory_limit": "1G", "knee_gain": 0.05, "tolerance": 1e-5,
                            "min_runs": 5, "min_seconds": 0.1, "warmup": 1}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(x: int | float | str) -> int:
    """Bytes from a number or a string such as ``"512M"`` / ``"2G"`` / ``"64KiB"``."""
    if isinstance(x, int | float):
        return int(x)
    text = x.strip().upper().removesuffix("IB").removesuffix("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def batch_symbol(graph: Graph) -> str | None:
    """The symbol that is dim 0 of the first input with a symbolic dim 0, if any."""
    for v in graph.inputs:
        if v.type.rank and isinstance(v.type.shape[0], DimExpr):
            names = v.type.shape[0].symbols()
            if len(names) == 1 and v.type.shape[0] == sym(next(iter(names))):
                return next(iter(names))
    return None


def _nbytes(v: Value, env: Mapping[str, int]) -> int | None:
    """The bytes of ``v`` at ``env``; None when a dim is data-dependent (``NonZero``'s count ...): only run
    time sizes it."""
    n = 1
    for d in v.type.shape:
        if not isinstance(d, int) and is_unknown(d):
            return None
        n *= d if isinstance(d, int) else evaluate(d, env)
    return n * v.type.dtype.np.itemsize


def runtime_sized(graph: Graph) -> list[str]:
    """The top-level values (and inputs) whose extent is data-dependent, so no memory figure can count them."""
    values = [*graph.inputs, *(o for n in graph.nodes for o in n.outputs)]
    return [v.name for v in values if any(not isinstance(d, int) and is_unknown(d) for d in v.type.shape)]


def memory_figures(graph: Graph, env: Mapping[str, int]) -> dict[str, float | None]:
    """Bytes per call (top-level values), from the graph's memory plan when it has one.  Values with a
    data-dependent extent (:func:`runtime_sized`) are sized only at run time and are left out of every
    figure (a lower bound then)."""
    from cuvil.ir.graph import reads

    last: dict[Value, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in reads(n):
            last[v] = i
    end = len(graph.nodes)
    for v in graph.outputs:
        last[v] = end
    sizes: dict[Value, tuple[int, int, int]] = {}
    weights = 0
    for i, n in enumerate(graph.nodes):
        for o in n.outputs:
            nbytes = _nbytes(o, env)
            if nbytes is None:
                continue
            if n.op == "constant":
                weights += nbytes
            else:
                sizes[o] = (i, last.get(o, i), nbytes)
    peak = 0
    for i in range(end):
        peak = max(peak, sum(b for first, lst, b in sizes.values() if first <= i <= lst))
    out: dict[str, float | None] = {
        "allocated_bytes": float(sum(b for _, _, b in sizes.values())), "peak_live_bytes": float(peak),
        "peak_bytes": float(peak), "input_bytes": float(sum(_nbytes(v, env) or 0 for v in graph.inputs)),
        "weights_bytes": float(weights), "arena_bytes": None, "arena_lower_bound_bytes": None,
        "largest_free_block": None, "fragmentation": None}
    plan = graph.memory_plan
    if plan is not None and plan.values:
        dims = {k: v for k, v in env.items() if k in plan.symbols}
        planned = {graph.nodes[pv.node].outputs[pv.output] for pv in plan.values}
        own = float(sum(b for v, (_, _, b) in sizes.items() if v not in planned))
        arena = float(plan.arena_bytes(dims))
        out.update(allocated_bytes=arena + own, peak_bytes=arena + own, arena_bytes=arena,
                   arena_lower_bound_bytes=float(plan.lower_bound_bytes(dims)),
                   largest_free_block=float(plan.largest_free_block(None, dims)),
                   fragmentation=plan.fragmentation(None, dims))
    return out


@register_check
class BatchScaling(Check):
    """Throughput, latency and memory per batch size, the knee, and batched vs unbatched agreement."""

    name = "batch-scaling"
    group = "runtime"
    description = "throughput and memory per batch size up to a memory limit, and where scaling stops"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx, DEFAULTS)
        return [self._one(ctx, t, cfg) for t in ctx.targets]

    def _one(self, ctx: Any, target: str, cfg: dict[str, Any]) -> CheckResult:
        t_start = time.perf_counter()
        m = ctx.compiled(target)
        graph = m.graph if m.graph is not None else ctx.graph
        name = cfg.get("symbol") or batch_symbol(ctx.graph)
        if name is None or name not in m.symbols:
            return CheckResult(self.name, Status.SKIP, "the model has no symbolic batch dim", target=target)
        info = m.symbols[name]
        if info.min is not None and info.min == info.max:
            return CheckResult(self.name, Status.SKIP, f"the batch dim {name!r} is fixed at {info.min}", target=target,
                               where={"symbol": name})
        step = info.multiple_of or 1
        lo = max(info.min or 1, step, getattr(ctx.dim_domains().get(name), "min", 1))  # where the graph is valid
        lo = -(-lo // step) * step
        hi = max(min(info.max if info.max is not None else 1 << 62, int(cfg["max_batch"])), lo)
        limit = parse_bytes(cfg["memory_limit"])

        def footprint(b: int) -> dict[str, float | None]:
            # the other symbols where the samples have them (ctx.symbol_values: valid for the graph)
            env = {**{s: self._default(m, s) for s in m.symbols}, **ctx.symbol_values({name: b})}
            return memory_figures(graph, env)

        def fits(b: int) -> bool:
            f = footprint(b)
            return (f["peak_bytes"] or 0.0) + (f["input_bytes"] or 0.0) + (f["weights_bytes"] or 0.0) <= limit

        sizes: list[int] = []
        b = lo
        while b <= hi and fits(b):
            sizes.append(b)
            b *= 2
        stop = "memory limit" if b <= hi else ("the symbol's maximum" if info.max is not None and b > info.max
                                               else "max_batch")
        if sizes and b <= hi:  # bisect for the largest size under the memory limit
            good, bad = sizes[-1], b
            while bad - good > step:
                mid = (good + bad) // 2 // step * step
                if mid <= good:
                    break
                good, bad = (mid, bad) if fits(mid) else (good, mid)
            if good != sizes[-1]:
                sizes.append(good)
        elif sizes and sizes[-1] < hi and hi // step * step > sizes[-1]:
            sizes.append(hi // step * step)
        if not sizes:
            return CheckResult(self.name, Status.FAIL, f"even the smallest batch ({lo}) needs more than the memory "
                               f"limit of {limit} bytes", target=target, where={"symbol": name},
                               details={"footprint": footprint(lo)})
        rows: list[dict[str, Any]] = []
        worst: dict[str, Any] | None = None
        tol = float(cfg["tolerance"])
        measured = self._measured_memory(m, ctx, name, sizes)
        for b in sizes:
            inputs = ctx.inputs(symbols={name: b})
            times = measure(functools.partial(m, *inputs), min_runs=int(cfg["min_runs"]),
                            min_seconds=float(cfg["min_seconds"]), max_runs=10_000, warmup=int(cfg["warmup"]))
            med = float(np.median(times))
            err, output = self._batch_agreement(m, graph, name, lo, inputs)
            row = {"batch": b, "median_ms": med * 1e3, "throughput": b / med if med > 0 else float("inf"),
                   "batch_vs_single_rel_l2": err, **footprint(b)}
            if measured is not None:
                rss = float(measured[b])
                row.update(peak_rss_delta_bytes=rss, peak_bytes=rss, allocated_bytes=None, peak_live_bytes=None)
            rows.append(row)
            if err > tol and worst is None:
                worst = {"batch": b, "output": output, "rel_l2": err}
        knee = rows[-1]["batch"]
        gain = float(cfg["knee_gain"])
        for a, c in itertools.pairwise(rows):
            if c["throughput"] < a["throughput"] * (1 + gain):
                knee = a["batch"]
                break
        figures: dict[str, float] = {"knee_batch": float(knee), "max_batch": float(rows[-1]["batch"]),
                                     "best_throughput": max(r["throughput"] for r in rows)}
        details: dict[str, Any] = {"symbol": name, "series": rows, "stopped_by": stop, "memory_limit": limit}
        unsized = runtime_sized(graph)
        note = ""
        if unsized and measured is None:
            details["runtime_sized"] = {
                "values": unsized, "note": "data-dependent extents (known only at run time) are left out of the "
                                           "computed memory figures, which are lower bounds for them"}
            note = (f"; {len(unsized)} value(s) with a data-dependent extent ({', '.join(unsized[:3])}) are sized only "
                    "at run time and left out of the memory figures")
        over: list[int] = []
        if measured is not None:
            figures["peak_rss_delta_bytes_at_max"] = rows[-1]["peak_rss_delta_bytes"]
            details["memory_source"] = (f"measured: {target} is not a Cuvil build, so Cuvil's plan says nothing of "
                                        "its allocations; peak_bytes is the peak resident set of one run minus the "
                                        "resident set before it (a fresh process per batch size); allocated, "
                                        "peak-live and arena figures are n/a")
            details["size_selection"] = "estimated from the imported graph's value liveness"
            over = [r["batch"] for r in rows
                    if r["peak_bytes"] + (r["input_bytes"] or 0.0) + (r["weights_bytes"] or 0.0) > limit]
            if over:
                details["over_limit"] = over
        else:
            figures["peak_live_bytes_at_max"] = rows[-1]["peak_live_bytes"]
            details["memory_source"] = "computed from the build's graph and memory plan at each size"
        if rows[-1]["arena_bytes"] is not None:
            figures.update(arena_bytes_at_max=rows[-1]["arena_bytes"],
                           fragmentation_at_max=rows[-1]["fragmentation"])
        elif measured is not None:
            details["fragmentation_note"] = f"not applicable: {target}'s arena is its own, not a Cuvil memory plan"
        else:
            details["fragmentation_note"] = ("not applicable: the pipeline had no plan-memory pass, so each value "
                                             "is allocated on its own (no arena)")
        if worst is not None:
            return CheckResult(self.name, Status.FAIL,
                               f"at batch {worst['batch']}, output {worst['output']!r} differs from the same samples "
                               f"run at batch {lo} (relative L2 {worst['rel_l2']:.3g} > {tol:.3g})",
                               target=target, figures=figures, details=details,
                               where={"symbol": name, "batch": str(worst["batch"]), "output": str(worst["output"])},
                               seconds=time.perf_counter() - t_start)
        if over:
            return CheckResult(self.name, Status.WARN,
                               f"at batch {over[0]}, {target}'s measured footprint exceeds the memory limit of "
                               f"{limit} bytes (the sizes were chosen by the graph's liveness estimate)", target=target, figures=figures, details=details,
                               where={"symbol": name, "batch": str(over[0])}, seconds=time.perf_counter() - t_start)
        summary = (f"batches {', '.join(str(r['batch']) for r in rows)} (stopped by {stop}); knee at {knee}; "
                   f"best {figures['best_throughput']:.1f} samples/s{note}")
        return CheckResult(self.name, Status.PASS, summary, target=target, figures=figures, details=details,
                           seconds=time.perf_counter() - t_start)

    def _measured_memory(self, m: Any, ctx: Any, name: str, sizes: list[int]) -> dict[int, int] | None:
        """Measured memory per batch size for a build that measures its own (``peak_memory``), else None."""
        measure = getattr(m, "peak_memory", None)
        if not callable(measure):
            return None
        return dict(zip(sizes, measure([ctx.inputs(symbols={name: b}) for b in sizes])))

    @staticmethod
    def _default(m: Any, s: str) -> int:
        from cuvil.ir.samples import default_symbol_value

        return default_symbol_value(m.symbols.get(s))

    @staticmethod
    def _batch_agreement(m: Any, graph: Graph, name: str, lo: int, inputs: list[np.ndarray]) -> tuple[float, str | None]:
        """Largest relative L2 between the first ``lo`` samples of a batched run and the same samples run alone."""
        batch_dim = sym(name)
        small = [a[:lo] if v.type.rank and v.type.shape[0] == batch_dim else a for v, a in zip(graph.inputs, inputs)]
        full = m(*inputs)
        alone = m(*small)
        worst, where = 0.0, None
        for v, big, one in zip(graph.outputs, full, alone):
            if v.type.rank and v.type.shape[0] == batch_dim:
                err = relative_l2(np.asarray(big)[:lo], np.asarray(one))
                if not err <= worst:
                    worst, where = err, v.name
        return worst, where

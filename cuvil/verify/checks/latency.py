"""The ``latency`` check: end-to-end latency per target, and where the time goes.

End-to-end latency is measured on the build users get (``ctx.compiled``),
calling it exactly as they do, over at least ``min_runs`` runs and at least
``min_seconds`` (after ``warmup`` runs): median, p90, p99.  A spread too wide
to trust ((p90 - median) / median above ``max_spread``) is a warning; a
``budget_ms`` on the median, when configured, fails the check.

The decomposition comes from a profiling build of the same graph for C
targets (``CodegenOptions.profile``: a timestamp after the input checks,
after every top-level node, i.e. every kernel or fusion group, and after the
outputs), called directly so the Python-side input guard is timed on its own:

- ``validate``: the Python input guard (types, shapes, symbol constraints);
- ``bind inputs``: the C input checks and binding (inputs are not copied);
- one span per kernel (fusion group), by Cuvil node;
- ``copy-out``: handing the outputs over;
- ``call overhead``: the rest of the call (ctypes marshalling, wrapping outputs).

The profiling build's median next to the plain build's shows what the
timestamps cost.  A subject with its own profiler (an onnxruntime session:
``profile(inputs, runs)``) is decomposed by it: one span per kernel, the
session's overhead and the call's.  Other targets report end-to-end figures only.  With the
``trace`` option (a path), the median profiled run of every target is written
as a Chrome trace (cuvil/verify/trace.py).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.backends.registry import find_backend
from cuvil.ir.graph import Graph
from cuvil.verify.base import Check, CheckResult, Status, register_check

DEFAULTS: dict[str, Any] = {"min_runs": 20, "min_seconds": 0.5, "max_runs": 10_000, "warmup": 3, "max_spread": 0.5}


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """Median, p90, p99, min and max of ``samples`` (seconds in, milliseconds out)."""
    a = np.asarray(samples, dtype=np.float64) * 1e3
    return {"median_ms": float(np.median(a)), "p90_ms": float(np.percentile(a, 90)),
            "p99_ms": float(np.percentile(a, 99)), "min_ms": float(a.min()), "max_ms": float(a.max())}


def measure(fn: Callable[[], object], *, min_runs: int, min_seconds: float, max_runs: int, warmup: int) -> list[float]:
    """Wall-clock seconds of each call of ``fn``: at least ``min_runs`` and ``min_seconds`` (at most ``max_runs``)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


class ProfiledModel:
    """A profiling C build of ``graph`` (its own folder under ``work_dir``), called directly."""

    def __init__(self, graph: Graph, target: str, work_dir: Path, num_threads: int = 1) -> None:
        from cuvil.backends.c.codegen import CodegenOptions, generate
        from cuvil.backends.c.library import NativeModel
        from cuvil.backends.c.toolchain import Compiler, build_library, variant_here, variants_for

        self.graph = graph
        module = generate(graph, CodegenOptions(target=target, model_name=graph.name, profile=True))
        folder = work_dir / f"latency-profile-{target}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.c").write_text(module.source, encoding="utf-8")
        (folder / "weights.bin").write_bytes(module.weights)
        # the code this CPU runs: the target's variant library where it loads one (toolchain.TARGET_VARIANTS)
        variant = variant_here(variants_for(target, module.source))
        build_library(Compiler(), folder / "model.c", folder / "model.so", target, variant=variant)
        self.native = NativeModel(folder / "model.so", folder / "weights.bin")
        self.native.set_num_threads(num_threads)
        self._read = self.native.lib.cuvil_profile_read
        self._read.restype = ctypes.c_int
        self._read.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        self.slots = len(graph.nodes) + 3
        self._buf = (ctypes.c_int64 * self.slots)()

    def run_once(self, inputs: Sequence[np.ndarray], guard: Callable[[], object]) -> list[tuple[str, str, float]]:
        """One call: (span name, category, seconds) for each phase, in order."""
        t0 = time.perf_counter_ns()
        guard()
        t1 = time.perf_counter_ns()
        self.native.run(list(inputs))
        t2 = time.perf_counter_ns()
        if self._read(self._buf, self.slots) != self.slots:
            raise RuntimeError("the profiling build's timestamp count does not match its graph")
        s = list(self._buf)
        spans = [("validate", "python", (t1 - t0) * 1e-9), ("bind inputs", "copy-in", (s[1] - s[0]) * 1e-9)]
        other = 0.0
        for i, n in enumerate(self.graph.nodes):
            dt = (s[i + 2] - s[i + 1]) * 1e-9
            if n.op == "constant":
                other += dt
            else:
                spans.append((f"{n.name} ({n.op})", "kernel", dt))
        last = len(self.graph.nodes) + 2
        spans.append(("copy-out", "copy-out", (s[last] - s[last - 1]) * 1e-9 + other))
        spans.append(("call overhead", "overhead", max((t2 - t1) * 1e-9 - (s[last] - s[0]) * 1e-9, 0.0)))
        return spans


@register_check
class Latency(Check):
    """End-to-end latency per target (median, p90, p99) and its decomposition."""

    name = "latency"
    group = "runtime"
    description = "end-to-end latency and its decomposition into validation, kernels, copies and overhead"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx, DEFAULTS)
        inputs = ctx.inputs()
        results = [self._one(ctx, t, inputs, cfg) for t in ctx.targets]
        if cfg.get("trace"):
            from cuvil.verify.trace import write_chrome_trace

            write_chrome_trace(cfg["trace"], results)
        return results

    def _one(self, ctx: Any, target: str, inputs: list[np.ndarray], cfg: dict[str, Any]) -> CheckResult:
        t_start = time.perf_counter()
        m = ctx.compiled(target)
        opts = {k: cfg[k] for k in ("min_runs", "min_seconds", "max_runs", "warmup")}
        times = measure(lambda: m(*inputs), **opts)
        figures = percentiles(times)
        figures["runs"] = float(len(times))
        details: dict[str, Any] = {"runs": len(times), "measured_seconds": float(sum(times))}
        backend = find_backend(target)
        if backend is not None and backend.is_c and m.graph is not None:  # the C code generator profiles
            self._decompose(ctx, target, m, inputs, opts, figures, details)
        elif callable(getattr(m, "profile", None)):  # a runtime with its own profiler (the onnxruntime subject)
            runs = m.profile(inputs, opts["warmup"] + max(opts["min_runs"], min(len(times), 200)))
            self._summarize(runs[opts["warmup"]:], figures, details)
            details["profiling_note"] = ("breakdown from a second session with the runtime's own profiler on; "
                                         "profiled_median_ms next to median_ms shows what profiling costs")
        else:
            details["breakdown_note"] = f"{target}: end-to-end only (per-kernel timing is a C-target feature)"
        spread = (figures["p90_ms"] - figures["median_ms"]) / figures["median_ms"] if figures["median_ms"] > 0 else 0.0
        figures["spread"] = spread
        budget = cfg.get("budget_ms")
        head = (f"median {figures['median_ms']:.3f} ms, p90 {figures['p90_ms']:.3f} ms, p99 {figures['p99_ms']:.3f} ms "
                f"over {len(times)} runs")
        where: dict[str, str] = {}
        if budget is not None and figures["median_ms"] > float(budget):
            status, summary = Status.FAIL, f"{head}: median above the budget of {float(budget):.3f} ms"
            slowest = max(details.get("breakdown", []), key=lambda b: b["median_ms"] if b["cat"] == "kernel" else -1,
                          default=None)
            if slowest is not None:
                where["node"] = slowest["name"]
        elif spread > float(cfg["max_spread"]):
            status = Status.WARN
            summary = f"{head}: spread (p90 - median) / median = {spread:.2f} > {float(cfg['max_spread']):.2f}, too wide to trust"
        else:
            status, summary = Status.PASS, head
        return CheckResult(self.name, status, summary, target=target, figures=figures, details=details, where=where,
                           seconds=time.perf_counter() - t_start)

    def _decompose(self, ctx: Any, target: str, m: Any, inputs: list[np.ndarray], opts: dict[str, Any],
                   figures: dict[str, float], details: dict[str, Any]) -> None:
        from cuvil.runtime.guards import bind_inputs

        build = getattr(m, "build_info", None)  # the plain build's thread count
        prof = ProfiledModel(m.graph, target, Path(ctx.work_dir), 1 if build is None else build.num_threads or 1)
        sig = m.signature

        def guard() -> object:
            return bind_inputs(m.input_names, [s.type for s in m.input_specs], inputs, sig.symbols, sig.checks,
                               sig.dropped_guard)

        runs: list[list[tuple[str, str, float]]] = []
        totals: list[float] = []

        def once() -> None:
            spans = prof.run_once(inputs, guard)
            runs.append(spans)
            totals.append(sum(s[2] for s in spans))

        measure(once, **opts)
        self._summarize(runs[opts["warmup"]:], figures, details)
        details["profiling_note"] = ("breakdown from a profiling build of the same graph with the same thread count; "
                                     "profiled_median_ms next to median_ms shows what the timestamps cost")

    @staticmethod
    def _summarize(runs: list[list[tuple[str, str, float]]], figures: dict[str, float], details: dict[str, Any]) -> None:
        """Per-span medians, the median run's timeline and the per-category figures of profiled runs."""
        totals = [sum(s[2] for s in spans) for spans in runs]
        breakdown: list[dict[str, Any]] = []
        for j, (name, cat, _) in enumerate(runs[0]):
            col = [r[j][2] for r in runs]
            breakdown.append({"name": name, "cat": cat, "median_ms": float(np.median(col)) * 1e3,
                              "p90_ms": float(np.percentile(col, 90)) * 1e3})
        details["breakdown"] = breakdown
        median_run = runs[int(np.argsort(totals)[len(totals) // 2])]
        timeline, at = [], 0.0
        for name, cat, sec in median_run:
            timeline.append({"name": name, "cat": cat, "start_us": at * 1e6, "dur_us": sec * 1e6})
            at += sec
        details["timeline"] = timeline
        profiled = percentiles(totals)
        figures["profiled_median_ms"] = profiled["median_ms"]
        figures["kernels_median_ms"] = sum(b["median_ms"] for b in breakdown if b["cat"] == "kernel")
        for cat in ("python", "copy-in", "copy-out", "overhead"):
            figures[f"{cat}_median_ms"] = sum(b["median_ms"] for b in breakdown if b["cat"] == cat)

"""The ``passes`` check: what each pass of a target's pipeline does to the IR and to the numbers.

For each target, the pipeline it compiles with (``cuvil.pipeline.build_pipeline`` for the
target and the suite's compile options, or ``[checks.passes] pipeline`` in place of its passes) runs on the imported graph under the PassManager with the
``verify-each``, ``numeric-each`` (on the suite's seeded inputs) and ``timing`` instruments.
Per pass the result records whether the IR stayed valid, the relative L2 error the pass
introduced on each output (reference interpreter, against the graph before it) and its time.

The check fails, naming the first responsible pass, when:

1. a pass raises, changes the graph's signature or leaves invalid IR (``verify-each``);
2. a pass introduces a relative L2 error above ``max_error`` on some output (default 1e-6 when
   every float output is float32 or float64, 1e-3 when one is float16 or bfloat16;
   ``pass_max_error = {"pass-name" = limit}`` overrides it per pass);
3. every pass looked right to the interpreter but the compiled target's outputs differ from
   the reference interpreter's by more than ``target_max_error`` (relative L2, default 1e-4): the pipeline is then bisected with the passes limit (compile with the first k
   passes, compare with the reference) to the first k whose build is wrong, so that a pass whose
   damage only shows after code generation is pinned too.  A build with no passes that is
   already wrong points at code generation (``where = {"stage": "codegen"}``), not at a pass.

``where = {"pass": name, "index": k}`` (1-based position in the pipeline) and the IR before and
after that pass is attached: ``details["attachments"]`` holds the two texts, which the JSON
report also writes as files beside ``report.json``.  The texts are the parsable IR (so
``cuvil opt`` can replay the pass) unless the graph's constants hold more than
``attach_max_elements`` elements (default 4M), when large tensors are elided.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.metrics import relative_l2
from cuvil.passes import (
    NumericEach,
    Pass,
    PassManager,
    PassReport,
    PipelineError,
    Timing,
    VerifyEach,
    format_pipeline,
)
from cuvil.passes.base import format_pass
from cuvil.pipeline import build_pipeline
from cuvil.verify.base import Check, CheckResult, Status, VerifyError, register_check

DEFAULT_MAX_ERROR = 1e-6
DEFAULT_MAX_ERROR_REDUCED = 1e-3
DEFAULT_TARGET_MAX_ERROR = 1e-4
DEFAULT_ATTACH_MAX_ELEMENTS = 4_000_000


def output_errors(got: Sequence[np.ndarray], want: Sequence[np.ndarray], names: Sequence[str]) -> dict[str, float]:
    """Relative L2 error of each output against ``want`` (:func:`cuvil.metrics.relative_l2`)."""
    return {n: relative_l2(g, w) for n, g, w in zip(names, got, want)}


def default_max_error(graph: Graph) -> float:
    reduced = {DType.f16, DType.bf16}
    return DEFAULT_MAX_ERROR_REDUCED if any(v.type.dtype in reduced for v in graph.outputs) else DEFAULT_MAX_ERROR


def constant_elements(graph: Graph) -> int:
    return sum(int(np.asarray(n.attrs["value"]).size) for n in graph.walk() if n.op == "constant")


def ir_around(graph: Graph, passes: Sequence[Pass], index: int, *, elide: bool) -> tuple[str, str | None, str | None]:
    """The IR text before and after pass ``index`` (1-based) of ``passes`` run on a copy of ``graph``,
    and why there is no "after" text when the pass raised."""
    from cuvil.ir.printer import print_graph
    from cuvil.passes.rewrite import copy_graph

    g = PassManager(list(passes[: index - 1])).run(copy_graph(graph))
    before = print_graph(g, elide=elide)
    try:
        after = passes[index - 1].run(copy_graph(g)).graph
    except Exception as exc:  # the pass under suspicion may well raise: that is the finding
        return before, None, f"{type(exc).__name__}: {exc}"
    try:
        return before, print_graph(after, elide=elide), None
    except Exception as exc:  # broken IR may not even print
        return before, None, f"the IR after the pass does not print: {type(exc).__name__}: {exc}"


@dataclass
class Blame:
    """The first pass found responsible, and how it was found."""

    index: int  # 1-based; 0 when the input graph or code generation is to blame
    name: str
    reason: str
    how: str  # "verify-each", "numeric-each", "pipeline", "bisect" or "codegen"


def _instrumented(graph: Graph, pipeline: Sequence[Pass], inputs: Sequence[np.ndarray]) -> tuple[PassReport, str | None]:
    """The pipeline run with verify-each, numeric-each and timing; and the error that stopped it, if any."""
    from cuvil.passes.rewrite import copy_graph

    pm = PassManager(list(pipeline), [VerifyEach(), NumericEach(inputs=inputs), Timing()])
    try:
        pm.run(copy_graph(graph))
    except PipelineError as exc:
        report = exc.report or pm.report
        assert report is not None
        return report, str(exc)
    assert pm.report is not None
    return pm.report, None


def _rows(report: PassReport, passes: Sequence[Pass]) -> list[dict[str, Any]]:
    """One row per pass of the pipeline; those after a pass that stopped the run say they did not run."""
    rows = []
    for r in report.records:
        row = r.to_json()
        row.pop("dump", None)
        row["max_error"] = r.max_error
        row["ran"] = not r.skipped
        rows.append(row)
    for i, p in enumerate(passes[len(rows):], len(rows) + 1):
        rows.append({"index": i, "name": p.name, "text": format_pass(p), "ran": False, "verified": None,
                     "max_error": None, "seconds": None})
    return rows


@register_check
class Passes(Check):
    """Every pass of each target's pipeline keeps the IR valid and the numbers within a threshold."""

    name = "passes"
    group = "ir-stability"
    description = "per pass: IR validity, error introduced, time; bisects a failure to the first responsible pass"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx)
        configured = cfg.get("pipeline")
        if configured is not None and not isinstance(configured, str):
            raise VerifyError(f"[checks.passes] pipeline must be pipeline text, got {configured!r}")
        graph = ctx.graph
        max_error = float(cfg.get("max_error", default_max_error(graph)))
        per_pass = {str(k): float(v) for k, v in dict(cfg.get("pass_max_error", {})).items()}
        target_max = float(cfg.get("target_max_error", DEFAULT_TARGET_MAX_ERROR))
        attach_max = int(cfg.get("attach_max_elements", DEFAULT_ATTACH_MAX_ELEMENTS))
        inputs = ctx.inputs()
        runs: dict[str, tuple[PassReport, str | None, float]] = {}
        results = []
        for target in ctx.targets:
            t0 = time.perf_counter()
            try:  # the pipeline the target's build runs (cuvil.pipeline), or the configured one in its place
                passes = list(build_pipeline(target, ctx.compile_options(target, passes=configured)).passes)
            except CuvilError as exc:
                raise VerifyError(f"[checks.passes] pipeline: {exc}") from exc
            if not passes:
                results.append(CheckResult(self.name, Status.SKIP, f"the {target} target runs no passes", target=target,
                                           details={"pipeline": ""}))
                continue
            key = format_pipeline(passes)
            if key not in runs:
                t1 = time.perf_counter()
                report, stopped = _instrumented(graph, passes, inputs)
                runs[key] = (report, stopped, time.perf_counter() - t1)
            report, stopped, seconds = runs[key]
            r = self._one(ctx, target, graph, passes, configured is not None, report, stopped, seconds, inputs,
                          max_error, per_pass, target_max, attach_max)
            r.seconds = time.perf_counter() - t0
            results.append(r)
        return results

    def _one(self, ctx: Any, target: str, graph: Graph, passes: list[Pass], configured: bool, report: PassReport,
             stopped: str | None, seconds: float, inputs: list[np.ndarray], max_error: float,
             per_pass: Mapping[str, float], target_max: float, attach_max: int) -> CheckResult:
        ran = report.ran()
        rows = _rows(report, passes)
        errs = [r.max_error for r in ran if r.max_error is not None]
        figures: dict[str, float] = {
            "passes": float(len(passes)),
            "max_pass_error": max(errs, default=0.0),
            "pipeline_seconds": sum(r.seconds or 0.0 for r in ran),
            "instrumented_seconds": seconds,
        }
        details: dict[str, Any] = {
            "pipeline": format_pipeline(passes), "passes": rows, "notes": list(report.notes),
            "thresholds": {"max_error": max_error, "pass_max_error": dict(per_pass), "target_max_error": target_max},
        }
        blame = self._blame_interpreter(report, stopped, max_error, per_pass)
        if target != "ref" and blame is None:  # a pass the interpreter blames needs no build to be pinned
            names = [v.name for v in graph.outputs]
            want = ctx.reference(inputs)
            try:
                got = self._build(ctx, target, passes, len(passes), configured)(*inputs)
                target_errors = output_errors(got, want, names)
            except CuvilError as exc:
                target_errors = {n: float("inf") for n in names}
                details["target_build_error"] = f"{type(exc).__name__}: {exc}"
            details["target_errors"] = target_errors
            figures["target_rel_l2"] = max(target_errors.values(), default=0.0)
            if not figures["target_rel_l2"] <= target_max:
                blame, trail = self._bisect(ctx, target, passes, configured, inputs, want, names, target_max,
                                            figures["target_rel_l2"])
                details["bisect"] = trail
        if blame is None:
            worst = max(ran, key=lambda r: r.max_error or 0.0, default=None)
            at = f", by {worst.text}" if worst is not None and worst.max_error else ""
            tail = (f"; {target} output within {figures['target_rel_l2']:.3g} of the reference"
                    if "target_rel_l2" in figures else "")
            return CheckResult(self.name, Status.PASS,
                               f"{len(passes)} passes keep the IR valid; largest error a pass introduced "
                               f"{figures['max_pass_error']:.3g}{at} (at most {max_error:g}){tail}",
                               target=target, figures=figures, details=details)
        details["blame"] = {"index": blame.index, "pass": blame.name, "found_by": blame.how, "reason": blame.reason}
        where = ({"pass": blame.name, "index": str(blame.index)} if blame.index > 0
                 else {"stage": "codegen" if blame.how == "codegen" else "input"})
        if blame.index > 0:
            elide = constant_elements(graph) > attach_max
            before, after, why = ir_around(graph, passes, blame.index, elide=elide)
            stem = f"{blame.index:03d}-{blame.name}"
            attachments = {f"before-{stem}.cir": before}
            if after is not None:
                attachments[f"after-{stem}.cir"] = after
            else:
                details["after_missing"] = why
            details["attachments"] = attachments
            details["attachments_elided"] = elide
        summary = (f"pass #{blame.index} {blame.name!r} is the first responsible: {blame.reason}" if blame.index > 0
                   else blame.reason)
        return CheckResult(self.name, Status.FAIL, summary, target=target, figures=figures, details=details,
                           where=where)

    @staticmethod
    def _blame_interpreter(report: PassReport, stopped: str | None, max_error: float,
                           per_pass: Mapping[str, float]) -> Blame | None:
        """The first pass that broke the run or the numbers, as the instruments saw it."""
        if stopped is not None:
            ran = report.ran()
            if not ran:
                return Blame(0, "input", f"the imported graph is rejected before any pass: {stopped}", "verify-each")
            last = ran[-1]
            how = "verify-each" if last.verified is False else "pipeline"
            return Blame(last.index, last.name, stopped, how)
        for r in report.ran():
            limit = per_pass.get(r.name, max_error)
            if r.max_error is not None and not r.max_error <= limit:
                worst = max(r.errors or {}, key=lambda n: (r.errors or {})[n])
                return Blame(r.index, r.name, f"it changed output {worst!r} by a relative L2 error of "
                             f"{r.max_error:.3g} > {limit:g} (reference interpreter)", "numeric-each")
        return None

    def _build(self, ctx: Any, target: str, passes: Sequence[Pass], k: int, configured: bool) -> Any:
        if k == len(passes) and not configured:
            return ctx.compiled(target)  # the build every other check shares
        return ctx.compiled(target, passes=format_pipeline(passes[:k]))

    def _bisect(self, ctx: Any, target: str, passes: Sequence[Pass], configured: bool, inputs: Sequence[np.ndarray],
                want: Sequence[np.ndarray], names: Sequence[str], limit: float, full_error: float
                ) -> tuple[Blame, list[dict[str, Any]]]:
        """The first k whose build (the first k passes) is wrong, knowing the build with all of them is."""
        n = len(passes)
        trail: list[dict[str, Any]] = [{"passes": n, "pipeline": format_pipeline(passes), "rel_l2": full_error}]
        errors: dict[int, float] = {n: full_error}

        def wrong(k: int) -> bool:
            entry: dict[str, Any] = {"passes": k, "pipeline": format_pipeline(passes[:k])}
            try:
                errs = output_errors(self._build(ctx, target, passes, k, configured)(*inputs), want, names)
                entry["rel_l2"] = max(errs.values(), default=0.0)
            except CuvilError as exc:
                entry["rel_l2"] = float("inf")
                entry["error"] = f"{type(exc).__name__}: {exc}"
            trail.append(entry)
            errors[k] = entry["rel_l2"]
            return not errors[k] <= limit

        if wrong(0):
            return Blame(0, "codegen", f"the {target} build is wrong even with no passes (relative L2 "
                         f"{errors[0]:.3g} > {limit:g}): code generation, not a pass", "codegen"), trail
        good, bad = 0, n
        while bad - good > 1:
            mid = (good + bad) // 2
            if wrong(mid):
                bad = mid
            else:
                good = mid
        return Blame(bad, passes[bad - 1].name,
                     f"the {target} build with the first {bad} passes differs from the reference interpreter "
                     f"(relative L2 {errors[bad]:.3g} > {limit:g}) and the build with the first {good} does not; "
                     "the interpreter saw no error, so the damage shows after code generation", "bisect"), trail

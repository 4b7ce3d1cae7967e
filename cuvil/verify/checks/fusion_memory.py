"""The ``fusion-memory`` check: builds that must agree, compared output by output on the same inputs.

For each target whose pipeline runs passes (``cuvil.pipeline.build_pipeline``: the reference
interpreter fuses and plans nothing, so ``ref`` is skipped), on the suite's seeded inputs:

1. fused / unfused: the target's build against one with ``enable_fusion=False``; fusion may
   change rounding, so float outputs may differ by a relative L2 of ``fused_max_rel_l2``
   (default 1e-5); other outputs must be equal.
2. planned / unplanned: the target's pipeline with the ``plan-memory`` pass against the same
   pipeline without it; memory placement changes no arithmetic, so outputs must be bitwise equal.
3. poisoned / planned: the planned build against one whose plan poisons the arena
   (``plan-memory{poison=true}``: every region filled with NaN when freed and before first
   use), bitwise: any read of stale memory shows up, and on a correct compiler poisoning changes
   nothing.

Pairs 2 and 3 need the ``plan-memory`` pass (and its ``poison`` option); without it they are
reported as skipped, with the reason, in ``details["pairs"]``.  A bitwise mismatch is narrowed
to the first layer whose value differs: every value of the graph the plan is made for (the
pipeline up to ``plan-memory``) gets a copy node right after its producer, whose output is
an extra graph output, and both builds of the pair are made from that tapped graph.  A copy
taken when the value is produced shows the value as computed, so the first differing tap is the
first node that computed from corrupted memory.  The taps change the plan a little (they
are outputs, not arena values); when they hide the mismatch the result says so.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.graph import Graph, Node, Value
from cuvil.metrics import compare
from cuvil.passes import Pass, PassManager, all_passes, format_pipeline, parse_pipeline
from cuvil.pipeline import Pipeline, build_pipeline
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.passes import output_errors

PLAN = "plan-memory"
DEFAULT_FUSED_MAX_REL_L2 = 1e-5


def bitwise_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray], names: Sequence[str]) -> list[str]:
    """The outputs whose shape, dtype or bytes differ."""
    return [n for n, x, y in zip(names, a, b)
            if x.shape != y.shape or x.dtype != y.dtype or np.ascontiguousarray(x).tobytes() != np.ascontiguousarray(y).tobytes()]


def plan_support() -> tuple[bool, bool, str | None]:
    """Whether the plan-memory pass is registered, whether it can poison, and why a pair is skipped."""
    cls = all_passes().get(PLAN)
    if cls is None:
        return False, False, f"no {PLAN} pass is registered"
    if "poison" not in {f.name for f in dataclasses.fields(cls)}:
        return True, False, f"the {PLAN} pass has no poison option"
    return True, True, None


def plan_pipelines(pipeline: str | Sequence[Pass]) -> tuple[list[Pass], list[Pass], list[Pass]]:
    """Planned, unplanned and poisoned variants of ``pipeline`` (text or passes; plan-memory added when absent)."""
    passes = parse_pipeline(pipeline) if isinstance(pipeline, str) else list(pipeline)
    unplanned = [p for p in passes if p.name != PLAN]
    planned = passes if len(unplanned) < len(passes) else [*passes, *parse_pipeline(PLAN)]
    poisoned = [dataclasses.replace(p, poison=True) if p.name == PLAN else p for p in planned]  # type: ignore[call-arg]
    return planned, unplanned, poisoned


def compiled_pipeline(ctx: Any, target: str, **options: Any) -> Pipeline:
    """The pipeline ``ctx.compiled(target, **options)`` runs (``cuvil.pipeline.build_pipeline``)."""
    return build_pipeline(target, ctx.compile_options(target, **options))


def display_name(target: str) -> str:
    from cuvil.backends.registry import get_backend

    return get_backend(target).display_name()


def tap_copies(graph: Graph) -> tuple[Graph, list[tuple[Node, Value, str]]]:
    """``graph`` (changed in place) with a copy of every top-level computed value made right after its
    producer and returned as an extra output; and per tap, its node, value and output name."""
    taps: list[tuple[Node, Value, str]] = []
    nodes: list[Node] = []
    outputs = set(graph.outputs)
    taken = {v.name for n in graph.walk() for v in n.outputs} | {v.name for v in graph.inputs}
    for node in graph.nodes:
        nodes.append(node)
        if node.op == "constant":
            continue
        for v in node.outputs:
            if v in outputs:
                continue
            name = f"{v.name}.tap"
            while name in taken:
                name += "_"
            taken.add(name)
            out = Value(name, v.type)
            copy = Node("identity", [v], [out], {}, f"{node.name}.tap")
            out.producer = copy
            nodes.append(copy)
            graph.outputs.append(out)
            taps.append((node, v, name))
    graph.nodes = nodes
    return graph, taps


@register_check
class FusionMemory(Check):
    """Fused vs unfused, memory-planned vs unplanned, and poisoned-arena builds agree output by output."""

    name = "fusion-memory"
    group = "ir-stability"
    description = "fused/unfused builds within tolerance; planned/unplanned and poisoned/planned builds bitwise equal"

    def builds(self, ctx: Any) -> list[tuple[str, dict[str, Any]]]:
        """The builds :meth:`run` compares, so that the runner can start them ahead, all at once."""
        return [(t, options) for t in ctx.targets if compiled_pipeline(ctx, t).passes
                for options in self.variants(ctx, t).values()]

    @staticmethod
    def variants(ctx: Any, target: str) -> dict[str, dict[str, Any]]:
        """Build options by variant: fused (the default build), unfused, and, with a plan-memory pass,
        planned, unplanned and (when it can poison) poisoned.  Every variant's pipeline is the one
        compile builds for its options (``cuvil.pipeline.build_pipeline``): the unfused build is the
        default build with ``enable_fusion=False``, the memory variants its pipeline with plan-memory
        removed or changed."""
        out: dict[str, dict[str, Any]] = {"fused": {}, "unfused": {"enable_fusion": False}}
        has_plan, can_poison, _ = plan_support()
        if has_plan:
            pipeline = compiled_pipeline(ctx, target)
            base = pipeline.text
            planned, unplanned, poisoned = (format_pipeline(p) for p in plan_pipelines(pipeline.passes))
            out["planned"] = {} if planned == base else {"passes": planned}
            out["unplanned"] = {"passes": unplanned}
            if can_poison:
                out["poisoned"] = {"passes": poisoned}
        return out

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx)
        fused_max = float(cfg.get("fused_max_rel_l2", DEFAULT_FUSED_MAX_REL_L2))
        inputs = ctx.inputs()
        results = []
        for target in ctx.targets:
            t0 = time.perf_counter()
            if not compiled_pipeline(ctx, target).passes:
                r = CheckResult(self.name, Status.SKIP, f"{display_name(target)} runs no passes: it fuses and plans "
                                "nothing", target=target)
            else:
                r = self._one(ctx, target, inputs, fused_max)
            r.seconds = time.perf_counter() - t0
            results.append(r)
        return results

    def _one(self, ctx: Any, target: str, inputs: list[np.ndarray], fused_max: float) -> CheckResult:
        names = ctx.compiled("ref").output_names
        pairs: list[dict[str, Any]] = []
        failure: dict[str, Any] | None = None
        tensors: dict[str, np.ndarray] = {}

        def run(**options: Any) -> list[np.ndarray]:
            build = ctx.compiled(target, **options) if options else ctx.compiled(target)
            return [np.asarray(o) for o in build(*inputs)]

        fused, unfused = run(), run(enable_fusion=False)
        errors = output_errors(fused, unfused, names)
        bad = [n for n, a, b in zip(names, fused, unfused)
               if not (errors[n] <= fused_max if b.dtype.kind == "f" else not bitwise_diff([a], [b], [n]))]
        pairs.append({"pair": "fused/unfused", "status": "fail" if bad else "pass", "rel_l2": errors,
                      "tolerance": fused_max, "differing_outputs": bad})
        if bad:
            failure = pairs[-1]
            tensors = {f"{bad[0]}.fused": fused[names.index(bad[0])], f"{bad[0]}.unfused": unfused[names.index(bad[0])]}

        has_plan, can_poison, why = plan_support()
        pipeline = compiled_pipeline(ctx, target)
        base = pipeline.text
        if not has_plan:
            pairs += [{"pair": p, "status": "skip", "reason": why} for p in ("planned/unplanned", "poisoned/planned")]
        else:
            planned_p, unplanned_p, poisoned_p = plan_pipelines(pipeline.passes)
            texts = {k: format_pipeline(v) for k, v in
                     (("planned", planned_p), ("unplanned", unplanned_p), ("poisoned", poisoned_p))}
            outs = {"planned": run() if texts["planned"] == base else run(passes=texts["planned"]),
                    "unplanned": run(passes=texts["unplanned"])}
            todo = [("planned/unplanned", "planned", "unplanned")]
            if can_poison:
                outs["poisoned"] = run(passes=texts["poisoned"])
                todo.append(("poisoned/planned", "poisoned", "planned"))
            else:
                pairs.append({"pair": "poisoned/planned", "status": "skip", "reason": why})
            for label, a, b in todo:
                diff = bitwise_diff(outs[a], outs[b], names)
                entry: dict[str, Any] = {"pair": label, "status": "fail" if diff else "pass", "bitwise": True,
                                         "differing_outputs": diff, "pipelines": {a: texts[a], b: texts[b]}}
                if diff:
                    entry["difference"] = {n: _diff_stats(outs[a][names.index(n)], outs[b][names.index(n)]) for n in diff}
                    entry["first_layer"] = self._first_layer(ctx, target, inputs, planned_p,
                                                              {"planned": planned_p, "unplanned": unplanned_p,
                                                               "poisoned": poisoned_p}, a, b)
                    if failure is None:
                        failure = entry
                        i = names.index(diff[0])
                        tensors = {f"{diff[0]}.{a}": outs[a][i], f"{diff[0]}.{b}": outs[b][i]}
                pairs.append(entry)
        figures = {"pairs_compared": float(sum(p["status"] != "skip" for p in pairs)),
                   "pairs_failed": float(sum(p["status"] == "fail" for p in pairs)),
                   "pairs_skipped": float(sum(p["status"] == "skip" for p in pairs)),
                   "fused_max_rel_l2": max(errors.values(), default=0.0)}
        details: dict[str, Any] = {"pairs": pairs}
        skipped = [f"{p['pair']} ({p['reason']})" for p in pairs if p["status"] == "skip"]
        if failure is not None:
            out = failure["differing_outputs"][0]
            where = {"output": out, "pair": failure["pair"]}
            layer = failure.get("first_layer") or {}
            if layer.get("value"):
                where.update(layer=str(layer["value"]), node=str(layer["node"]), op=str(layer["op"]))
            how = (f"relative L2 {failure['rel_l2'][out]:.3g} > {fused_max:g}" if failure["pair"] == "fused/unfused"
                   else "not bitwise equal" + (f"; the first layer that differs is {layer['value']!r} (node "
                                               f"{layer['node']!r}, {layer['op']})" if layer.get("value") else ""))
            return CheckResult(self.name, Status.FAIL, f"{failure['pair']} builds disagree on output {out!r}: {how}",
                               target=target, figures=figures, details=details, where=where, tensors=tensors)
        compared = [p["pair"] for p in pairs if p["status"] == "pass"]
        summary = (f"{', '.join(compared)} agree (fused/unfused within {figures['fused_max_rel_l2']:.3g}"
                   f"{', the others bitwise' if len(compared) > 1 else ''})")
        if skipped:
            summary += f"; skipped: {'; '.join(skipped)}"
        return CheckResult(self.name, Status.PASS, summary, target=target, figures=figures, details=details)

    def _first_layer(self, ctx: Any, target: str, inputs: list[np.ndarray], planned: list[Pass],
                     variants: dict[str, list[Pass]], a: str, b: str) -> dict[str, Any]:
        """The first tapped value that differs between builds ``a`` and ``b`` (see the module docstring)."""
        import cuvil
        from cuvil.passes.rewrite import copy_graph

        cut = next((i for i, p in enumerate(planned) if p.name == PLAN), len(planned))
        prefix = planned[:cut]
        try:
            graph, taps = tap_copies(PassManager(prefix).run(copy_graph(ctx.graph)))
            n_out = len(graph.outputs) - len(taps)
            got: dict[str, list[np.ndarray]] = {}
            for which in (a, b):
                rest = variants[which][cut:] if which != "unplanned" else [p for p in planned[cut:] if p.name != PLAN]
                options = ctx.compile_options(target, passes=format_pipeline(rest))
                got[which] = [np.asarray(o) for o in
                              cuvil.compile(copy_graph(graph), target=target, options=options)(*inputs)]
        except CuvilError as exc:
            return {"value": None, "note": f"the tapped builds failed: {type(exc).__name__}: {exc}"}
        # graph order over the tapped values and the graph's own outputs (an output's producer is a layer too)
        column = {v.name: i for i, v in enumerate(graph.outputs[:n_out])}
        column.update({v.name: n_out + k for k, (_, v, _) in enumerate(taps)})
        for node in graph.nodes:
            for v in node.outputs:
                i = column.get(v.name)
                if i is None:
                    continue
                x, y = got[a][i], got[b][i]
                if bitwise_diff([x], [y], [v.name]):
                    return {"value": v.name, "node": node.name, "op": node.op, "difference": _diff_stats(x, y)}
        return {"value": None, "note": "no tapped value differs: the taps changed the plan enough to hide the mismatch"}


def _diff_stats(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """How two tensors differ: the number of unequal elements (NaN equals NaN) and the largest difference
    (:func:`cuvil.metrics.compare`: infinite, with the reason, where a non-finite value is on one side only)."""
    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    x, y = a.astype(np.float64), b.astype(np.float64)
    unequal = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    c = compare(x, y)
    stats: dict[str, Any] = {"differing_elements": int(unequal.sum()), "elements": int(a.size), "max_abs": c.max_abs}
    if c.problem is not None:
        stats["problem"] = c.problem
    return stats

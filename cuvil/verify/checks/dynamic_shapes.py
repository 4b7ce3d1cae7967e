"""The ``dynamic-shapes`` check: each symbolic dim at its constraint's boundaries, and just outside them.

For each symbol that sizes an input, one at a time (the others at their
smallest valid values), every target runs at the minimum, just inside it,
the maximum, just inside it, multiples of a ``multiple_of`` constraint and a
few seeded random valid values, and is compared with the reference
interpreter (relative L2 at most ``max_rel_l2``; integer outputs exactly, near-ties of
an ArgMax/TopK excused: cuvil/verify/labels.py).  "Valid" is where the graph
is valid (cuvil.ir.dim_domains, over the declared constraint): the probes start
at the smallest extent every window, reshape and relation of the graph allows,
and a probe value the graph cannot run at moves to the next one it can (the
details say so); values the input guard accepts below that extent are noted.  Values just outside
(minimum - 1, maximum + 1, a non-multiple) must be refused with an
``InputError`` before anything runs; refused later (by the compiled code)
is a warning, accepted is a failure (a warning for a subject that cannot know
the constraints, such as an onnxruntime session on an ONNX model, which
declares none).

Sizes are bounded: a value whose inputs would hold more than
``max_elements`` elements in all is replaced by the largest valid value
within that budget, and the details say so.  A symbol without a maximum
is a warning, with a suggested constraint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError, InputError
from cuvil.ir.dim_domains import DimAnalysis, merge_info
from cuvil.ir.samples import default_symbol_value
from cuvil.ir.symbolic import evaluate, free_symbols
from cuvil.ir.types import SymbolInfo
from cuvil.metrics import error_figures
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.labels import LabelJudge, is_exact


def input_elements(specs: Sequence[Any], symbols: Mapping[str, SymbolInfo], values: Mapping[str, int],
                   defaults: Mapping[str, int] | None = None) -> int:
    """How many elements the inputs hold in all with the symbols at ``values`` (others at ``defaults``, else
    at small valid values)."""
    env = {**(defaults or {}), **values}
    for s in specs:
        for d in s.type.shape:
            for name in free_symbols(d):
                env.setdefault(name, default_symbol_value(symbols.get(name)))
    return sum(int(np.prod([evaluate(d, env) for d in s.type.shape], dtype=np.int64)) for s in specs)


def boundary_values(info: SymbolInfo, cap: int, randoms: int, rng: np.random.Generator) -> list[tuple[str, int]]:
    """(case, value) pairs of valid values to run: boundaries, just inside, multiples, random; all <= ``cap``."""
    step = info.multiple_of or 1
    lo = default_symbol_value(info)
    hi = None if info.max is None else info.max // step * step
    top = min(hi if hi is not None else lo + 16 * step, cap)
    cases: list[tuple[str, int]] = [("minimum", lo), ("just inside the minimum", lo + step)]
    if hi is not None:
        cases += [("maximum", hi), ("just inside the maximum", hi - step)]
        if hi > top:
            cases.append(("largest value within the element budget", top))
    if info.multiple_of:
        cases += [("multiple", 2 * step), ("multiple", 3 * step)]
    if top >= lo:
        n_steps = (top - lo) // step
        cases += [("random", lo + step * int(k)) for k in rng.integers(0, n_steps + 1, size=randoms)]
    seen: set[int] = set()
    out = []
    for case, v in cases:
        if lo <= v <= top and v not in seen and (hi is None or v <= hi):
            seen.add(v)
            out.append((case, v))
    return out


def outside_values(info: SymbolInfo) -> list[tuple[str, int]]:
    """(case, value) pairs just outside the constraint, each of which the model must refuse."""
    out = []
    if info.min is not None and info.min - 1 >= 0:
        out.append((f"below the minimum {info.min}", info.min - 1))
    if info.max is not None:
        out.append((f"above the maximum {info.max}", info.max + 1))
    if info.multiple_of and info.multiple_of > 1:
        v = default_symbol_value(info) + 1
        if info.max is None or v <= info.max:
            out.append((f"not a multiple of {info.multiple_of}", v))
    return out


@register_check
class DynamicShapes(Check):
    """Each symbolic dim at its boundaries against the reference, and refused just outside them."""

    name = "dynamic-shapes"
    group = "compatibility"
    description = "symbolic dims at their constraint boundaries, and refused just outside"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx)
        budget = int(cfg.get("max_elements", 1 << 20))
        randoms = int(cfg.get("random_values", 3))
        max_rel = float(cfg.get("max_rel_l2", 1e-5))
        ref = ctx.compiled("ref")
        specs, symbols = ref.input_specs, ref.symbols
        in_inputs = {n for s in specs for d in s.type.shape for n in free_symbols(d)}
        if not symbols:
            return [CheckResult(self.name, Status.SKIP, "the model has no symbolic dims")]
        plan: dict[str, dict[str, Any]] = {}
        notes: list[str] = []
        rng = np.random.default_rng(ctx.seed)
        analysis: DimAnalysis = ctx.dim_analysis()
        doms = analysis.domains()
        mins = {n: d.min for n, d in doms.items()}
        for s, info in sorted(symbols.items()):
            if s not in in_inputs:
                notes.append(f"{s}: sizes no input (computed inside the model); not varied")
                continue
            dom = doms.get(s)
            graph_info = merge_info(s, info, dom.info() if dom is not None else None)
            cap = self._cap(specs, symbols, s, graph_info, budget, mins)
            valid = self._valid(analysis, s, boundary_values(graph_info, cap, randoms, rng), graph_info, cap, notes)
            guard_lo = default_symbol_value(info)
            if dom is not None and dom.min > guard_lo:
                notes.append(f"{s}: the graph is valid from {dom.min} ({'; '.join(dom.reasons) or 'its constraints'}); "
                             f"{guard_lo}..{dom.min - 1} pass the input guard but not the graph (declare --dim "
                             f"{s}={dom.min}: to refuse them)")
            if info.max is not None and info.max > cap:
                notes.append(f"{s}: values above {cap} not run (inputs would exceed max_elements={budget}); "
                             f"the maximum {info.max} is checked only by its rejection of {info.max + 1}")
            plan[s] = {"info": info, "graph_info": graph_info, "valid": valid, "outside": outside_values(info),
                       "cap": cap}
        cases: dict[tuple[str, int], tuple[list[np.ndarray], list[np.ndarray] | None]] = {}
        for s, p in plan.items():
            for _, v in p["valid"]:
                inputs = ctx.inputs(symbols={s: v})
                cases[(s, v)] = (inputs, ctx.reference(inputs))
            for _, v in p["outside"]:
                if input_elements(specs, symbols, {s: v}, mins) <= 4 * budget:
                    cases[(s, v)] = (ctx.inputs(symbols={s: v}), None)
        return [self._target(ctx, t, plan, cases, notes, max_rel, budget) for t in ctx.targets]

    @staticmethod
    def _valid(analysis: DimAnalysis, s: str, cases: Sequence[tuple[str, int]], info: SymbolInfo, cap: int,
               notes: list[str]) -> list[tuple[str, int]]:
        """``cases`` with each value the graph cannot run at moved to the nearest one it can (up, else down)."""
        step = info.multiple_of or 1
        lo = default_symbol_value(info)
        out: list[tuple[str, int]] = []
        seen: set[int] = set()
        for case, v in cases:
            w = analysis.next_valid(s, v, limit=cap)
            if w is None:
                w = next((x for x in range(v - step, lo - 1, -step) if analysis.values({s: x})[1] is None), None)
            if w is None:
                notes.append(f"{s}={v} ({case}): the graph is valid at no value near it; not run")
                continue
            if w != v:
                notes.append(f"{s}={v} ({case}) is not valid for the graph ({analysis.values({s: v})[1]}); "
                             f"{w} is run instead")
                case = f"{case}, the nearest valid value"
            if w not in seen:
                seen.add(w)
                out.append((case, w))
        return out

    @staticmethod
    def _cap(specs: Sequence[Any], symbols: Mapping[str, SymbolInfo], s: str, info: SymbolInfo, budget: int,
             defaults: Mapping[str, int] | None = None) -> int:
        """The largest valid value of ``s`` whose inputs fit ``budget`` elements (at least its smallest value)."""
        step = info.multiple_of or 1
        lo = default_symbol_value(info)
        hi = info.max if info.max is not None else 1 << 40
        if input_elements(specs, symbols, {s: hi}, defaults) <= budget:
            return hi
        a, b = lo, hi  # a fits (or is the smallest value), b does not
        while b - a > step:
            mid = (a + b) // 2 // step * step
            if mid <= a:
                break
            a, b = (mid, b) if input_elements(specs, symbols, {s: mid}, defaults) <= budget else (a, mid)
        return a

    def _target(self, ctx: Any, target: str, plan: Mapping[str, dict[str, Any]],
                cases: Mapping[tuple[str, int], tuple[list[np.ndarray], list[np.ndarray] | None]],
                notes: list[str], max_rel: float, budget: int) -> CheckResult:
        try:
            model = ctx.compiled(target)
        except CuvilError as exc:
            return CheckResult(self.name, Status.FAIL, f"{target}: the model does not compile: {exc}", target=target,
                               details={"error": str(exc)}, where={"target": target})
        runs: list[dict[str, Any]] = []
        judge = LabelJudge(ctx.graph)
        refusals: list[dict[str, Any]] = []
        failures: list[tuple[str, str, int, str]] = []  # (symbol, case, value, why)
        warnings: list[tuple[str, str]] = []  # (symbol, why)
        worst = 0.0
        for s, p in plan.items():
            for case, v in p["valid"]:
                inputs, want = cases[(s, v)]
                row: dict[str, Any] = {"symbol": s, "value": v, "case": case}
                try:
                    got = model(*inputs)
                except CuvilError as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    failures.append((s, case, v, f"the valid value {s}={v} ({case}) is refused: {exc}"))
                    runs.append(row)
                    continue
                assert want is not None
                rel = max((error_figures(g, w)["rel_l2"] for g, w in zip(got, want) if not is_exact(w)), default=0.0)
                worst = max(worst, rel)
                row["rel_l2"] = rel
                if not rel <= max_rel:
                    failures.append((s, case, v, f"{s}={v} ({case}): relative L2 error {rel:.3g} against the "
                                     f"reference (at most {max_rel:g})"))
                for i, (g, w) in enumerate(zip(got, want)):  # integer outputs agree exactly, near-ties excused
                    if is_exact(w):
                        agree = judge.judge(i, model.output_names[i], g, w, inputs, max_rel)
                        if agree.near_ties:
                            row["near_ties"] = row.get("near_ties", 0) + agree.near_ties
                        if not agree.ok:
                            failures.append((s, case, v, f"{s}={v} ({case}): output {agree.output!r} differs from "
                                             f"the reference's: {agree.describe()}"))
                runs.append(row)
            for case, v in p["outside"]:
                row = {"symbol": s, "value": v, "case": case}
                if (s, v) not in cases:
                    row["outcome"] = f"not run: its inputs exceed {4 * budget} elements"
                    refusals.append(row)
                    continue
                inputs, _ = cases[(s, v)]
                try:
                    model(*inputs)
                except InputError as exc:
                    row["outcome"] = f"refused: InputError: {exc}"
                except CuvilError as exc:
                    row["outcome"] = f"refused late: {type(exc).__name__}: {exc}"
                    warnings.append((s, f"{s}={v} ({case}) is refused by the compiled code, not the input guard: {exc}"))
                else:
                    row["outcome"] = "accepted"
                    if ctx.enforces_constraints:
                        failures.append((s, case, v, f"{s}={v} ({case}) is accepted; it must be refused with an "
                                         "InputError"))
                    else:  # reported as the subject sees it: it has no constraint to enforce
                        warnings.append((s, f"{s}={v} ({case}) is accepted by {target}, which does not know the "
                                         "constraint: callers must check it themselves"))
                refusals.append(row)
            info = p["info"]
            if info.max is None:
                lo = default_symbol_value(p["graph_info"])
                spec = f"{lo}:{p['cap']}" + (f",%{info.multiple_of}" if info.multiple_of else "")
                warnings.append((s, f"{s} has no maximum; suggested constraint: --dim {s}={spec} (dims={{'{s}': "
                                f"({lo}, {p['cap']})}}), the largest value whose "
                                f"inputs fit max_elements={budget}"))
        details = {"symbols": {s: p["info"].describe() or "unconstrained" for s, p in plan.items()},
                   "runs": runs, "refusals": refusals, "notes": notes, "warnings": [w for _, w in warnings],
                   "thresholds": {"max_rel_l2": max_rel, "max_elements": budget}}
        figures = {"runs": float(len(runs)), "refusals_checked": float(len(refusals)), "max_rel_l2": worst,
                   "failures": float(len(failures))}
        if failures:
            s, case, v, why = failures[0]
            more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
            return CheckResult(self.name, Status.FAIL, why + more, target=target, figures=figures, details=details,
                               where={"symbol": s, "value": str(v), "case": case})
        if not plan:
            return CheckResult(self.name, Status.SKIP, "no symbol sizes an input; " + "; ".join(notes),
                               target=target, details=details)
        summary = (f"{len(runs)} runs at the boundaries of {', '.join(plan)} match the reference (largest relative "
                   f"L2 {worst:.3g}); {len(refusals)} values just outside are refused")
        if warnings:
            return CheckResult(self.name, Status.WARN, summary + "; " + warnings[0][1], target=target, figures=figures,
                               details=details, where={"symbol": warnings[0][0]})
        return CheckResult(self.name, Status.PASS, summary, target=target, figures=figures, details=details)

"""The ``precision`` and ``reproducibility`` checks, and the error figures the compatibility checks share.

``precision``: on seeded inputs, each target's outputs against a float64
reference (the reference interpreter run on a float64 copy of the graph),
next to the float32 source framework's own error against that reference
(onnxruntime for ONNX models, eager PyTorch for PyTorch modules, the
float32 reference interpreter for Cuvil graphs).  A target's float32 build fails when its
relative L2 error exceeds the larger of ``max_rel_l2`` and ``floor_multiple`` (8) times the model's
own float32 error (the reference interpreter's float32 run against its float64 run on the same
inputs: an ill-conditioned model, a softmax over many large logits, a cancellation, amplifies
rounding in every float32 implementation), or exceeds ``max_ratio`` times the source framework's
(errors below ``ratio_floor`` count as that floor, so two near-exact results are not compared by
their rounding noise).  The result shows the error, the floor and the bound.

On the C targets the check also compiles the model with ``precision="fp16"``
and ``"bf16"``: each output's error against the same float64 reference, next to
the float32 source framework's, must stay within ``reduced_max_rel_l2`` (default
1e-2), and a value that overflows float16 is refused naming the node, its op and
the value.  Each precision tried is reported, with whether it is viable and why
(``details["viability"]``).  Only the precisions the user selects count: option
``precisions`` (``[checks.precision] precisions = ["fp32", "fp16"]``) both selects
and limits what is tried; without it fp32 alone is selected and fp16 and bf16 are
tried for information, so a build of them that is not viable makes the result a
warning, never a failure (``where``: target, precision, node, op).

Integer and boolean outputs (class labels, masks, counts) are compared by exact agreement with the
float64 reference's instead; where one is an ``arg_max``/``top_k`` over float scores, a label picked
among scores within the build's bound of each other (float32 rounding for fp32, ``reduced_max_rel_l2``
for fp16 and bf16) is a near-tie, reported and excused (cuvil/verify/labels.py).

With calibration data (``calibration = "DIR"``: a folder of .npz samples, which
selects int8) the C targets' int8 builds are checked too: top-1 agreement with the float32 build on classifier
outputs (at least ``int8_min_top1``, 0.99), output SNR on the others (at least
``int8_min_snr_db``, 30 dB), and the compile's per-layer errors in the details
(``cuvil/verify/checks/precision_int8.py``).  Without it, int8 is reported as not checked,
with the setting that enables it.

``reproducibility``: the same inputs give bitwise-identical outputs across
repeated calls, across processes (the artifact saved, loaded and run in a
second Python process) and across thread counts (``num_threads`` of the C
targets), for each target that promises it.  The result says, per target,
what it promises.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.metrics import error_figures, relative_l2
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.precision_int8 import ENABLE_HINT, Int8Settings, int8_settings, judge_int8, judged_feeds
from cuvil.verify.labels import LabelJudge, is_exact

FLOAT32_EPS = float(np.finfo(np.float32).eps)
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
REDUCED = ("fp16", "bf16")
# A float32 build fails when worse than this multiple of the model's own float32 error (the reference
# interpreter's float32 run against its float64 run): an ill-conditioned model amplifies rounding in every
# float32 implementation, and a fixed bound would blame the build for it.
FLOOR_MULTIPLE = 8.0


def _is_c(target: str) -> bool:
    """Whether ``target`` is a C target (the backend table; False for a subject that is no target)."""
    from cuvil.backends.registry import find_backend

    backend = find_backend(target)
    return backend is not None and backend.is_c


def first_bit_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """None when ``a`` and ``b`` are bitwise identical, else where and how they first differ."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{a.dtype}{list(a.shape)} against {b.dtype}{list(b.shape)}"
    if a.tobytes() == b.tobytes():
        return None
    av = a.reshape(-1).view(np.uint8).reshape(a.size, a.dtype.itemsize)
    bv = b.reshape(-1).view(np.uint8).reshape(b.size, b.dtype.itemsize)
    flat = int(np.argmax(np.any(av != bv, axis=1)))
    idx = [int(i) for i in np.unravel_index(flat, a.shape)] if a.ndim else []
    count = int(np.sum(np.any(av != bv, axis=1)))
    return (f"{count} of {a.size} elements differ; first at index {idx}: "
            f"{a.reshape(-1)[flat].item()!r} against {b.reshape(-1)[flat].item()!r}")


def output_node(graph: Any, index: int) -> str:
    """The name of the node that produces graph output ``index`` (empty when it is an input)."""
    try:
        producer = graph.outputs[index].producer
    except (AttributeError, IndexError):
        return ""
    return str(getattr(producer, "name", "") or "")


def wide_reference(ctx: Any, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], str]:
    """The float64 reference outputs, or, when the graph cannot be widened (an op that takes float32 only,
    such as a custom op declared so), the float32 reference interpreter's; and which one it is."""
    try:
        return ctx.reference(inputs, float64=True), "reference interpreter in float64"
    except CuvilError as exc:
        return ctx.reference(inputs), f"reference interpreter in float32 (no float64 copy of the graph: {exc})"


def baseline_name(kind: str) -> str:
    return {"onnx": "onnxruntime (fp32)", "torch": "PyTorch eager (fp32)", "tensorflow": "TensorFlow (fp32)"}.get(
        kind, "reference interpreter (fp32)")


def _build_failure(check: str, target: str, exc: Exception) -> CheckResult:
    return CheckResult(check, Status.FAIL, f"{target}: the model does not compile: {exc}", target=target,
                       details={"error": f"{type(exc).__name__}: {exc}"}, where={"target": target})


# ---- precision -----------------------------------------------------------------------------------------------
@register_check
class Precision(Check):
    """Each target's error against a float64 reference, next to the float32 source framework's error."""

    name = "precision"
    group = "compatibility"
    description = "error against a float64 reference, compared with the source framework's own"

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = {**self.options, **ctx.check_config(self.name)}
        max_rel = float(cfg.get("max_rel_l2", 1e-5))
        max_ratio = float(cfg.get("max_ratio", 10.0))
        floor = float(cfg.get("ratio_floor", FLOAT32_EPS))
        multiple = float(cfg.get("floor_multiple", FLOOR_MULTIPLE))
        seeds = [int(s) for s in cfg.get("seeds", [ctx.seed])]
        names = ctx.compiled("ref").output_names
        cases = []
        source_error = ""
        for seed in seeds:
            inputs = ctx.inputs(seed=seed)
            wide, reference = wide_reference(ctx, inputs)
            try:
                base = ctx.source_outputs(inputs)
            except Exception as exc:
                base = None
                source_error = f"{type(exc).__name__}: {str(exc)[:300]}"
            ref32 = ctx.reference(inputs)  # the model's own float32 error floor: float32 against float64
            cases.append(Case(seed, inputs, wide, ref32 if base is None else base, ref32))
        given = cfg.get("precisions")
        selected = {"fp32", *(str(p) for p in given)} if given is not None else {"fp32"}
        reduced = [p for p in given if p in REDUCED] if given is not None else list(REDUCED)
        reduced_max = float(cfg.get("reduced_max_rel_l2", 1e-2))
        int8 = int8_settings(cfg)
        int8_wanted = given is None or "int8" in given
        int8_feeds = (judged_feeds(int8, ctx.graph, names)
                      if int8 is not None and int8_wanted and any(_is_c(t) for t in ctx.targets) else [])
        results = []
        judge = LabelJudge(ctx.graph)
        for target in ctx.targets:
            try:
                model = ctx.compiled(target)
            except CuvilError as exc:
                results.append(_build_failure(self.name, target, exc))
                continue
            rows = _rows(ctx, model, names, cases, floor, judge, max(max_rel, FLOAT32_EPS))
            precisions = {"fp32": "checked"}
            for p in REDUCED:
                precisions[p] = ("not checked: only the C targets compute it" if not _is_c(target) else
                                 "checked" if p in reduced else "not checked: not in the check's precisions")
            precisions["int8"] = ("not checked: the check builds int8 for the C targets" if not _is_c(target)
                                  else "not checked: not in the check's precisions" if not int8_wanted
                                  else f"not checked: int8 needs calibration data; {ENABLE_HINT}" if int8 is None
                                  else "checked")
            baseline = (baseline_name(ctx.source.kind) if not source_error else
                        f"{baseline_name('graph')}, as {baseline_name(ctx.source.kind)} cannot run the model")
            result = self._verdict(target, list(rows.values()), Bounds(max_rel, max_ratio, floor, multiple),
                                   precisions, baseline, reference)
            result.details["selected"] = sorted(selected, key=PRECISIONS.index)
            if source_error:
                result.details["source_error"] = source_error
            if _is_c(target):
                outcomes = [self._reduced(ctx, target, p, names, cases, floor, reduced_max, judge) for p in reduced]
                result = _combine(result, outcomes, selected)
                if int8 is not None and int8_wanted:
                    result = self._int8(ctx, result, target, int8, int8_feeds, names)
                elif int8_wanted and result.status is Status.PASS:
                    result.summary += '; int8 not checked: no calibration data ([checks.precision] calibration = "DIR")'
            results.append(result)
        return results

    def _reduced(self, ctx: Any, target: str, precision: str, names: Sequence[str], cases: list[Case],
                 floor: float, max_rel: float, judge: LabelJudge | None = None) -> Outcome:
        """What the ``precision`` build of ``target`` gives: its figures, or why it is not viable."""
        from cuvil.passes.convert_precision import PrecisionOverflowError

        try:
            model = ctx.compiled(target, precision=precision)
        except PrecisionOverflowError as exc:
            node, op = _overflow_site(str(exc))
            return Outcome(precision, {"overflow": str(exc)}, f"not viable: {exc}", failure=f"{precision}: {exc}",
                           where={"target": target, "precision": precision, "node": node, "op": op})
        except CuvilError as exc:  # e.g. an op that takes float32 only: the model needs overrides for this precision
            return Outcome(precision, {"error": str(exc)}, f"not viable: it does not compile: {exc}",
                           not_checked=f"not checked: it does not compile: {exc}",
                           failure=f"{precision}: the model does not compile: {exc}",
                           where={"target": target, "precision": precision})
        rows = list(_rows(ctx, model, names, cases, floor, judge, max_rel).values())
        worst = max(rows, key=lambda r: r["rel_l2"])
        details = {"max_rel_l2": max_rel, "outputs": rows}
        differ = next((r for r in rows if r.get("exact") and r["mismatches"]), None)
        if differ is not None:
            return Outcome(precision, details, f"not viable: output {differ['output']!r} changes: {differ['agreement']}",
                           failure=f"{precision} output {differ['output']!r}: {differ['agreement']} (the float64 "
                                   "reference's)", where={"target": target, "precision": precision,
                                                          "output": differ["output"], "node": differ["node"]},
                           rel_l2=worst["rel_l2"])
        if worst["rel_l2"] > max_rel:
            return Outcome(precision, details,
                           f"not viable at the bound: relative L2 error {worst['rel_l2']:.3g} above {max_rel:g}; keep "
                           f"the nodes that lose it in float32 (precision_overrides, see the layerwise check) or raise "
                           f"reduced_max_rel_l2", rel_l2=worst["rel_l2"],
                           failure=f"{precision} output {worst['output']!r}: relative L2 error {worst['rel_l2']:.3g} "
                                   f"above {max_rel:g} (the float32 source's: {worst['source_rel_l2']:.3g})",
                           where={"target": target, "precision": precision, "output": worst["output"],
                                  "node": worst["node"]})
        return Outcome(precision, details, f"viable: relative L2 error {worst['rel_l2']:.3g} within {max_rel:g}",
                       rel_l2=worst["rel_l2"],
                       passed=f"{precision}: relative L2 error {worst['rel_l2']:.3g} (at most {max_rel:g})")

    def _int8(self, ctx: Any, result: CheckResult, target: str, settings: Int8Settings,
              feeds: Sequence[Sequence[np.ndarray]], names: Sequence[str]) -> CheckResult:
        """``result`` with the int8 build of ``target`` checked too (the first failure wins)."""
        details = dict(result.details)
        where = {"target": target, "precision": "int8"}
        try:
            model = ctx.compiled(target, **settings.compile_options())
        except CuvilError as exc:  # a refusal (too few samples, an unexercised range ...) says what to do
            details["int8"] = {"error": f"{type(exc).__name__}: {exc}", "calibration": str(settings.calibration)}
            if result.status is Status.FAIL:
                return CheckResult(result.check, result.status, result.summary, target=target,
                                   figures=result.figures, details=details, where=result.where)
            return CheckResult(self.name, Status.FAIL, f"int8: the model does not compile: {exc}", target=target,
                               figures=result.figures, details=details, where=where)
        node_of = {name: output_node(ctx.graph, i) for i, name in enumerate(names)}
        outcome = judge_int8(model, ctx.compiled(target), feeds, names, settings, node_of)
        details["int8"] = outcome.details
        details["higher_is_better"] = [*details.get("higher_is_better", ()), "int8_top1_agreement"]
        figures = {**result.figures, **outcome.figures}
        if result.status is Status.FAIL:
            return CheckResult(result.check, result.status, result.summary, target=target, figures=figures,
                               details=details, where=result.where)
        if outcome.failure is not None:
            return CheckResult(self.name, Status.FAIL, outcome.failure, target=target, figures=figures,
                               details=details, where={**where, **(outcome.where or {})})
        return CheckResult(self.name, result.status, result.summary + outcome.summary, target=target,
                           figures=figures, details=details, where=result.where)

    def _verdict(self, target: str, rows: list[dict[str, Any]], bounds: Bounds, precisions: dict[str, str],
                 baseline: str, reference: str) -> CheckResult:
        """The float32 build's verdict: worse than max(``max_rel_l2``, ``floor_multiple`` x the model's own float32
        error) or than ``max_ratio`` x the source framework's fails."""
        for r in rows:
            r["bound"] = max(bounds.max_rel, bounds.multiple * r["floor_rel_l2"])
        bad = [r for r in rows if not (r["rel_l2"] <= r["bound"] and r["ratio"] <= bounds.max_ratio)]
        worst = max(rows, key=lambda r: (r["rel_l2"], r["ratio"]))
        figures = {"rel_l2": worst["rel_l2"], "max_abs": max(r["max_abs"] for r in rows),
                   "snr_db": min(r["snr_db"] for r in rows), "source_rel_l2": max(r["source_rel_l2"] for r in rows),
                   "ratio": max(r["ratio"] for r in rows), "floor_rel_l2": max(r["floor_rel_l2"] for r in rows),
                   "bound": worst["bound"]}
        details = {"precisions": precisions, "baseline": baseline, "reference": reference,
                   "floor": "the reference interpreter's float32 error against the float64 reference",
                   "thresholds": {"max_rel_l2": bounds.max_rel, "max_ratio": bounds.max_ratio,
                                  "ratio_floor": bounds.ratio_floor, "floor_multiple": bounds.multiple},
                   "outputs": rows}
        differ = next((r for r in rows if r.get("exact") and r["mismatches"]), None)
        if differ is not None:
            return CheckResult(self.name, Status.FAIL, f"fp32 output {differ['output']!r}: {differ['agreement']} "
                               "(integer outputs must agree exactly with the float64 reference's)", target=target,
                               figures={**figures, "label_mismatches": float(differ["mismatches"])}, details=details,
                               where={"output": differ["output"], "node": differ["node"]})
        ties = [r for r in rows if r.get("exact") and r["near_ties"]]
        if ties:
            figures["near_ties"] = float(sum(r["near_ties"] for r in ties))
        if bad:
            r = max(bad, key=lambda r: (r["rel_l2"], r["ratio"]))
            why = (f"relative L2 error {r['rel_l2']:.3g} above {r['bound']:.3g} (the larger of {bounds.max_rel:g} and "
                   f"{bounds.multiple:g}x the model's own float32 error {r['floor_rel_l2']:.3g})"
                   if r["rel_l2"] > r["bound"] else
                   f"relative L2 error {r['rel_l2']:.3g} is {r['ratio']:.3g}x {baseline}'s {r['source_rel_l2']:.3g} "
                   f"(at most {bounds.max_ratio:g}x)")
            return CheckResult(self.name, Status.FAIL, f"fp32 output {r['output']!r}: {why}", target=target,
                               figures=figures, details=details, where={"output": r["output"], "node": r["node"]})
        tie_note = "".join(f"; output {r['output']!r}: {r['agreement']}" for r in ties)
        return CheckResult(self.name, Status.PASS,
                           f"fp32: relative L2 error {worst['rel_l2']:.3g} against the {reference.split(' (')[0]} ({baseline}: "
                           f"{figures['source_rel_l2']:.3g}; the model's float32 floor {figures['floor_rel_l2']:.3g}, "
                           f"bound {worst['bound']:.3g}){tie_note}",
                           target=target, figures=figures, details=details)


@dataclass(frozen=True)
class Case:
    """One seed's inputs, the float64 reference, the source framework's float32 outputs and the reference
    interpreter's float32 outputs (the model's own float32 floor)."""

    seed: int
    inputs: Sequence[np.ndarray]
    wide: Sequence[np.ndarray]
    base: Sequence[np.ndarray]
    ref32: Sequence[np.ndarray]


@dataclass(frozen=True)
class Bounds:
    max_rel: float
    max_ratio: float
    ratio_floor: float
    multiple: float


@dataclass
class Outcome:
    """A reduced precision's build: its details, whether it is viable and why, and its verdict text."""

    precision: str
    details: dict[str, Any]
    viability: str
    rel_l2: float | None = None
    failure: str | None = None
    where: dict[str, str] = field(default_factory=dict)
    passed: str = ""
    not_checked: str = ""


def _combine(result: CheckResult, outcomes: Sequence[Outcome], selected: set[str]) -> CheckResult:
    """``result`` (the float32 verdict) with the reduced precisions' outcomes: a selected precision that is
    not viable fails the check, one the user did not select only warns (or, when it does not compile, is
    noted as not checked); the first failure wins."""
    details = dict(result.details)
    details["precisions"] = dict(details["precisions"])
    details["viability"] = {o.precision: o.viability for o in outcomes}
    figures = dict(result.figures)
    passed, warned, failed = [], [], []
    for o in outcomes:
        details[o.precision] = o.details
        if o.rel_l2 is not None:
            figures[f"{o.precision}_rel_l2"] = o.rel_l2
        if o.failure is None:
            passed.append(o.passed)
        elif o.precision in selected:
            failed.append(o)
        elif o.not_checked:
            details["precisions"][o.precision] = o.not_checked
        else:
            warned.append(o)
    if result.status is Status.FAIL:
        return CheckResult(result.check, Status.FAIL, result.summary, target=result.target, figures=figures,
                           details=details, where=result.where)
    if failed:
        return CheckResult(result.check, Status.FAIL, failed[0].failure or "", target=result.target, figures=figures,
                           details=details, where=failed[0].where)
    summary = "; ".join([result.summary.replace("; other precisions not available yet", ""), *passed])
    if warned:
        notes = "; ".join(f"{o.failure} (not selected, so this warns: add it to [checks.precision] precisions to "
                          f"make it count)" for o in warned)
        return CheckResult(result.check, Status.WARN, f"{notes}; {summary}", target=result.target, figures=figures,
                           details=details, where=warned[0].where)
    return CheckResult(result.check, result.status, summary, target=result.target, figures=figures, details=details,
                       where=result.where)


def _rows(ctx: Any, model: Any, names: Sequence[str], cases: list[Case], floor: float,
          judge: LabelJudge | None = None, tolerance: float = 0.0) -> dict[str, dict[str, Any]]:
    """Per output, the worst seed's error figures of ``model``, of the source framework and of the reference
    interpreter in float32 (the model's own float32 floor); an integer or boolean output's row says how it
    agrees exactly instead (cuvil.verify.labels: near-ties within ``tolerance`` excused, ``exact`` True)."""
    rows: dict[str, dict[str, Any]] = {}
    for case in cases:
        outs = model(*case.inputs)
        seed = case.seed
        for i, (name, got, ref64, src, own) in enumerate(zip(names, outs, case.wide, case.base, case.ref32)):
            if judge is not None and is_exact(ref64):
                agree = judge.judge(i, name, got, ref64, case.inputs, tolerance)
                row = rows.get(name)
                if row is None or (agree.mismatches, agree.near_ties) > (row["mismatches"], row["near_ties"]):
                    rows[name] = {"output": name, "node": output_node(ctx.graph, i), "seed": seed, "exact": True,
                                  **agree.to_json(), "agreement": agree.describe(), "rel_l2": 0.0, "max_abs": 0.0,
                                  "snr_db": float("inf"), "source_rel_l2": 0.0, "ratio": 0.0, "floor_rel_l2": 0.0}
                continue
            mine = error_figures(got, ref64)
            theirs = error_figures(src, ref64)
            model_floor = relative_l2(own, ref64)
            ratio = mine["rel_l2"] / max(theirs["rel_l2"], floor)
            row = rows.get(name)
            if row is None or mine["rel_l2"] > row["rel_l2"]:
                rows[name] = {"output": name, "node": output_node(ctx.graph, i), "seed": seed,
                              **mine, "source_rel_l2": theirs["rel_l2"], "source_max_abs": theirs["max_abs"],
                              "source_snr_db": theirs["snr_db"], "ratio": ratio,
                              "floor_rel_l2": model_floor if np.isfinite(model_floor) else 0.0}
    return rows


def _overflow_site(message: str) -> tuple[str, str]:
    """The node and op an overflow refusal names (``node 'NAME' (OP): ...``)."""
    import re

    m = re.search(r"node '([^']*)'(?: \(|, )([^),]*)", message)  # "node 'N' (op)" or "node 'N', op)"
    return (m.group(1), m.group(2)) if m else ("", "")


# ---- reproducibility -----------------------------------------------------------------------------------------
_CHILD = """
import sys
import numpy as np
import cuvil
m = cuvil.load(sys.argv[1])
with np.load(sys.argv[2]) as d:
    ins = [d[f"in{i}"] for i in range(len(d.files))]
np.savez(sys.argv[3], **{f"out{i}": np.asarray(o) for i, o in enumerate(m(*ins))})
"""


def threads_supported(target: str) -> bool:
    """Whether ``target`` splits calls over ``num_threads`` threads (the backend table)."""
    from cuvil.backends.registry import find_backend

    backend = find_backend(target)
    return backend is not None and backend.supports_threads


def promises(target: str, threads: bool | None = None) -> dict[str, str]:
    """What a target promises about bitwise reproducibility (and why it does not, where it does not),
    from what its backend can do; ``threads``: whether it splits calls over threads (default: its
    backend says)."""
    from cuvil.backends.registry import find_backend

    out = {"repeated runs": "promised"}
    backend = find_backend(target)
    if backend is None:  # a subject that is no Cuvil target: the onnxruntime session
        out["processes"] = f"not checked: an {target} session has no saved artifact"
        out["thread counts"] = f"not promised: {target} does not promise results independent of its thread count"
        return out
    who = backend.display_name()
    out["processes"] = ("promised (saved artifact, loaded in another process)" if backend.saves_artifacts
                        else f"not applicable: {who} has no saved artifact")
    threaded = backend.supports_threads if threads is None else threads
    out["thread counts"] = ("promised: results are bitwise the same for any num_threads" if threaded
                            else f"not applicable: {who} runs one thread")
    return out


@register_check
class Reproducibility(Check):
    """Bitwise-identical outputs across repeated runs, processes and thread counts, where promised."""

    name = "reproducibility"
    group = "compatibility"
    description = "bitwise-identical outputs across runs, processes and thread counts"

    def run(self, ctx: Any) -> list[CheckResult]:

        cfg = {**self.options, **ctx.check_config(self.name)}
        repeats = max(2, int(cfg.get("repeats", 3)))
        thread_counts = [int(n) for n in cfg.get("threads", [1, 2, 3])]
        check_processes = bool(cfg.get("processes", True))
        inputs = ctx.inputs()
        names = ctx.compiled("ref").output_names
        results = []
        for target in ctx.targets:
            try:
                model = ctx.compiled(target)
            except CuvilError as exc:
                results.append(_build_failure(self.name, target, exc))
                continue
            promised = promises(target, threads_supported(target))
            first = [np.array(o, copy=True) for o in model(*inputs)]
            parts: dict[str, str] = {}
            problems: list[tuple[str, str, str]] = []  # (part, output, difference)

            def compare(part: str, outs: Sequence[np.ndarray], first: list[np.ndarray] = first,
                        problems: list[tuple[str, str, str]] = problems) -> None:
                for name, a, b in zip(names, first, outs):
                    diff = first_bit_difference(a, np.asarray(b))
                    if diff is not None:
                        problems.append((part, name, diff))

            for _ in range(repeats - 1):
                compare("repeated runs", model(*inputs))
            parts["repeated runs"] = f"{repeats} runs"
            if promised["processes"].startswith("promised"):
                if check_processes:
                    try:
                        compare("processes", self._in_other_process(ctx, model, target, inputs))
                        parts["processes"] = "a second Python process ran the saved artifact"
                    except CuvilError as exc:
                        problems.append(("processes", "", str(exc)))
                else:
                    parts["processes"] = "skipped: processes = false in the configuration"
            if threads_supported(target):
                for n in thread_counts:
                    try:
                        compare(f"num_threads={n}", ctx.compiled(target, num_threads=n)(*inputs))
                    except CuvilError as exc:
                        problems.append((f"num_threads={n}", "", str(exc)))
                parts["thread counts"] = ", ".join(map(str, thread_counts))
            details = {"promises": promised, "checked": parts,
                       "problems": [{"part": p, "output": o, "difference": d} for p, o, d in problems]}
            figures = {"differences": float(len(problems))}
            if problems:
                part, out, diff = problems[0]
                return_where = {"output": out, "run": part}
                if out:
                    return_where["node"] = output_node(ctx.graph, names.index(out))
                results.append(CheckResult(self.name, Status.FAIL, f"{part}: output {out!r} is not bitwise identical: "
                                           f"{diff}", target=target, figures=figures, details=details,
                                           where=return_where))
            else:
                results.append(CheckResult(self.name, Status.PASS, "bitwise identical across "
                                           + "; ".join(f"{k} ({v})" for k, v in parts.items()), target=target,
                                           figures=figures, details=details))
        return results

    def _in_other_process(self, ctx: Any, model: Any, target: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The outputs of the model saved as an artifact and run by a fresh Python process."""
        import cuvil

        work = Path(ctx.work_dir) / "reproducibility" / target
        work.mkdir(parents=True, exist_ok=True)
        art = model.save(work / "artifact")
        arrays: dict[str, Any] = {f"in{i}": a for i, a in enumerate(inputs)}
        np.savez(work / "inputs.npz", **arrays)
        root = str(Path(cuvil.__file__).resolve().parents[1])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(art), str(work / "inputs.npz"),
                               str(work / "outputs.npz")], capture_output=True, text=True, env=env, timeout=600)
        if proc.returncode != 0:
            raise CuvilError(f"the second process failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        with np.load(work / "outputs.npz") as d:
            return [d[f"out{i}"] for i in range(len(d.files))]

"""The ``cross-target`` check: every available target on the same inputs, and the drift matrix between them.

Targets: every registered target whose code needs no particular CPU features
(``ref``, ``generic``, ``native`` and ``wasm32``: :func:`default_targets`), plus
any target the run was given; a target its backend says cannot be built or run
here (wasm32 without ziglang and wasmtime) is skipped with the reason.  Every
pair is compared output by output; an entry of the matrix is the largest
over the outputs of ``||a - b|| / ||float64 reference||``, so the matrix is
symmetric and every entry is on the same scale.  The last row and column
are the float64 reference itself.  A target fails when its drift from the
float64 reference on an output exceeds the larger of ``max_rel_l2`` and
``floor_multiple`` (8) times the model's own float32 error there (the
reference interpreter's float32 run against its float64 run, on the same
inputs: an ill-conditioned model amplifies rounding in every float32
implementation), or when it does not build or run: nothing is left out silently.
Integer and boolean outputs are not in the matrix: each target's must agree exactly with the
float64 reference's, a label of an ``arg_max``/``top_k`` picked among scores within float32
rounding (``max_rel_l2``) of each other being a near-tie, reported and excused (cuvil/verify/labels.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.metrics import drift, relative_l2
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.precision import FLOOR_MULTIPLE, output_node, wide_reference
from cuvil.verify.labels import Agreement, LabelJudge, is_exact

REFERENCE_LABEL = "float64 reference"


def default_targets() -> tuple[str, ...]:
    """The targets compared by default: every registered one whose code runs on any machine of its
    kind or on this one (the backend table; not the x86 targets with fixed CPU features, nor those
    that are compared only when asked for: ``Backend.compared_by_default``)."""
    from cuvil.backends.registry import backends

    return tuple(b.name for b in backends() if not b.required_features() and b.compared_by_default)


@register_check
class CrossTarget(Check):
    """Runs every available target on the same inputs and reports the drift matrix against the reference."""

    name = "cross-target"
    group = "compatibility"
    description = "drift matrix between every available target and a float64 reference"

    def builds(self, ctx: Any) -> list[tuple[str, dict[str, Any]]]:
        """The default build of every target :meth:`run` compares (so the runner can start them ahead)."""
        return [(t, {}) for t in self._targets(ctx)[0]]

    def _targets(self, ctx: Any) -> tuple[list[str], dict[str, str]]:
        """The targets to compare, and the ones skipped with the reason."""
        from cuvil.backends.registry import find_backend

        wanted = [str(t) for t in self.settings(ctx).get("targets", default_targets())]
        targets: list[str] = []
        skipped: dict[str, str] = {}
        used = {n.op for n in ctx.graph.walk()}
        for t in dict.fromkeys([*wanted, *ctx.targets]):
            backend = find_backend(t)  # None: a subject that is no target (onnxruntime), or a name compile refuses
            why = backend.unavailable() if backend is not None and t not in ctx.targets else None
            if why is None and backend is not None and t not in ctx.targets:
                lacking = sorted(used & backend.unsupported_ops())
                if lacking:  # a limitation the target declares, not a drift: compared once it has them
                    why = f"no {backend.family_label or t} kernel yet for {', '.join(lacking)}"
            if why is None:
                targets.append(t)
            else:
                skipped[t] = why
        return targets, skipped

    def run(self, ctx: Any) -> list[CheckResult]:
        cfg = self.settings(ctx)
        max_rel = float(cfg.get("max_rel_l2", 1e-5))
        multiple = float(cfg.get("floor_multiple", FLOOR_MULTIPLE))
        targets, skipped = self._targets(ctx)
        inputs = ctx.inputs(seed=int(cfg.get("seed", ctx.seed)))
        wide, reference = wide_reference(ctx, inputs)
        names = ctx.compiled("ref").output_names
        outputs: dict[str, Sequence[np.ndarray]] = {}
        errors: dict[str, str] = {}
        for t in targets:
            try:
                outputs[t] = [np.asarray(o) for o in ctx.compiled(t)(*inputs)]
            except CuvilError as exc:
                errors[t] = f"{type(exc).__name__}: {exc}"
        own = outputs["ref"] if "ref" in outputs else ctx.reference(inputs)  # the model's float32 floor
        floors = {n: relative_l2(own[i], wide[i]) for i, n in enumerate(names)}
        floors = {n: f if np.isfinite(f) else 0.0 for n, f in floors.items()}
        bounds = {n: max(max_rel, multiple * floors[n]) for n in names}
        labels = [t for t in targets if t in outputs] + [REFERENCE_LABEL]
        runs = {**outputs, REFERENCE_LABEL: wide}
        exact = [n for i, n in enumerate(names) if is_exact(wide[i])]
        floats = [n for n in names if n not in exact]
        per_output = {n: [[drift(runs[a][i], runs[b][i], wide[i]) for b in labels] for a in labels]
                      for i, n in enumerate(names) if n in floats}
        matrix = [[max((per_output[n][r][c] for n in floats), default=0.0) for c in range(len(labels))]
                  for r in range(len(labels))]
        judge = LabelJudge(ctx.graph)
        agreements: dict[str, list[Agreement]] = {
            t: [judge.judge(names.index(n), n, outputs[t][names.index(n)], wide[names.index(n)], inputs,
                            max_rel) for n in exact] for t in outputs}
        ref_col = len(labels) - 1
        figures = {f"drift[{t}]": matrix[r][ref_col] for r, t in enumerate(labels[:-1])}
        figures["max_drift"] = max(figures.values(), default=0.0)
        figures["floor_rel_l2"] = max(floors.values(), default=0.0)
        details: dict[str, Any] = {"labels": labels, "matrix": matrix, "per_output": per_output,
                                   "metric": "||a - b|| / ||float64 reference||, largest over the outputs",
                                   "threshold": {"max_rel_l2": max_rel, "floor_multiple": multiple},
                                   "floor": {"metric": "the reference interpreter's float32 error against the float64 "
                                                       "reference", "per_output": floors},
                                   "bounds": bounds, "errors": errors, "skipped": skipped,
                                   "reference": reference}
        details["integer_outputs"] = {t: [a.to_json() for a in found] for t, found in agreements.items() if found}
        figures["label_mismatches"] = float(sum(a.mismatches for found in agreements.values() for a in found))
        figures["near_ties"] = float(sum(a.near_ties for found in agreements.values() for a in found))
        over = [(per_output[n][r][ref_col] / bounds[n], t, n) for r, t in enumerate(labels[:-1]) for n in floats
                if not per_output[n][r][ref_col] <= bounds[n]]
        differ = [(t, a) for t, found in agreements.items() for a in found if not a.ok]
        if errors:
            t = next(iter(errors))
            return [CheckResult(self.name, Status.FAIL, f"target {t} does not build or run: {errors[t]}",
                                figures=figures, details=details, where={"target": t})]
        if differ:
            t, a = differ[0]
            return [CheckResult(self.name, Status.FAIL, f"{t}: output {a.output!r} differs from the float64 "
                                f"reference's: {a.describe()}", figures=figures, details=details,
                                where={"target": t, "output": a.output,
                                       "node": output_node(ctx.graph, names.index(a.output))})]
        if over:
            _, t, worst = max(over)
            value = per_output[worst][labels.index(t)][ref_col]
            return [CheckResult(self.name, Status.FAIL, f"{t} drifts {value:.3g} from the float64 reference on output "
                                f"{worst!r} (at most {bounds[worst]:.3g}: the larger of {max_rel:g} and {multiple:g}x "
                                f"the model's own float32 error {floors[worst]:.3g})", figures=figures, details=details,
                                where={"target": t, "output": worst, "node": output_node(ctx.graph, names.index(worst))})]
        note = f"; skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}" if skipped else ""
        if exact:
            ties = int(figures["near_ties"])
            note = (f"; integer outputs agree exactly ({ties} near-ties of the top scores excused)" if ties else
                    "; integer outputs agree exactly") + note
        return [CheckResult(self.name, Status.PASS, f"{len(labels) - 1} targets agree: largest drift from the float64 "
                            f"reference {figures['max_drift']:.3g} (the model's own float32 error {figures['floor_rel_l2']:.3g}){note}",
                            figures=figures, details=details)]

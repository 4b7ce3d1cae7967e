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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.metrics import drift, relative_l2
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.precision import FLOOR_MULTIPLE, output_node, wide_reference

REFERENCE_LABEL = "float64 reference"


def default_targets() -> tuple[str, ...]:
    """The targets compared by default: every registered one whose code runs on any machine of its
    kind or on this one (the backend table; not the x86 targets with fixed CPU features)."""
    from cuvil.backends.registry import backends

    return tuple(b.name for b in backends() if not b.required_features())


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
        for t in dict.fromkeys([*wanted, *ctx.targets]):
            backend = find_backend(t)  # None: a subject that is no target (onnxruntime), or a name compile refuses
            why = backend.unavailable() if backend is not None and t not in ctx.targets else None
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
        per_output = {n: [[drift(runs[a][i], runs[b][i], wide[i]) for b in labels] for a in labels]
                      for i, n in enumerate(names)}
        matrix = [[max((per_output[n][r][c] for n in names), default=0.0) for c in range(len(labels))]
                  for r in range(len(labels))]
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
        over = [(per_output[n][r][ref_col] / bounds[n], t, n) for r, t in enumerate(labels[:-1]) for n in names
                if not per_output[n][r][ref_col] <= bounds[n]]
        if errors:
            t = next(iter(errors))
            return [CheckResult(self.name, Status.FAIL, f"target {t} does not build or run: {errors[t]}",
                                figures=figures, details=details, where={"target": t})]
        if over:
            _, t, worst = max(over)
            value = per_output[worst][labels.index(t)][ref_col]
            return [CheckResult(self.name, Status.FAIL, f"{t} drifts {value:.3g} from the float64 reference on output "
                                f"{worst!r} (at most {bounds[worst]:.3g}: the larger of {max_rel:g} and {multiple:g}x "
                                f"the model's own float32 error {floors[worst]:.3g})", figures=figures, details=details,
                                where={"target": t, "output": worst, "node": output_node(ctx.graph, names.index(worst))})]
        note = f"; skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}" if skipped else ""
        return [CheckResult(self.name, Status.PASS, f"{len(labels) - 1} targets agree: largest drift from the float64 "
                            f"reference {figures['max_drift']:.3g} (the model's own float32 error {figures['floor_rel_l2']:.3g}){note}",
                            figures=figures, details=details)]

"""The ``cross-target`` check: every available target on the same inputs, and the drift matrix between them.

Targets: every registered target whose code needs no particular CPU features
(``ref``, ``generic``, ``native`` and ``wasm32``: :func:`default_targets`), plus
any target the run was given; a target its backend says cannot be built or run
here (wasm32 without ziglang and wasmtime) is skipped with the reason.  Every
pair is compared output by output; an entry of the matrix is the largest
over the outputs of ``||a - b|| / ||float64 reference||``, so the matrix is
symmetric and every entry is on the same scale.  The last row and column
are the float64 reference itself.  A target fails when its drift from the
float64 reference exceeds ``max_rel_l2``, or when it does not build or run:
nothing is left out silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.metrics import drift
from cuvil.verify.base import Check, CheckResult, Status, register_check
from cuvil.verify.checks.precision import output_node, wide_reference

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
        labels = [t for t in targets if t in outputs] + [REFERENCE_LABEL]
        runs = {**outputs, REFERENCE_LABEL: wide}
        per_output = {n: [[drift(runs[a][i], runs[b][i], wide[i]) for b in labels] for a in labels]
                      for i, n in enumerate(names)}
        matrix = [[max((per_output[n][r][c] for n in names), default=0.0) for c in range(len(labels))]
                  for r in range(len(labels))]
        ref_col = len(labels) - 1
        figures = {f"drift[{t}]": matrix[r][ref_col] for r, t in enumerate(labels[:-1])}
        figures["max_drift"] = max(figures.values(), default=0.0)
        details: dict[str, Any] = {"labels": labels, "matrix": matrix, "per_output": per_output,
                                   "metric": "||a - b|| / ||float64 reference||, largest over the outputs",
                                   "threshold": {"max_rel_l2": max_rel}, "errors": errors, "skipped": skipped,
                                   "reference": reference}
        over = [(matrix[r][ref_col], t) for r, t in enumerate(labels[:-1]) if not matrix[r][ref_col] <= max_rel]
        if errors:
            t = next(iter(errors))
            return [CheckResult(self.name, Status.FAIL, f"target {t} does not build or run: {errors[t]}",
                                figures=figures, details=details, where={"target": t})]
        if over:
            value, t = max(over)
            r = labels.index(t)
            worst = max(names, key=lambda n: per_output[n][r][ref_col])
            return [CheckResult(self.name, Status.FAIL, f"{t} drifts {value:.3g} from the float64 reference on output "
                                f"{worst!r} (at most {max_rel:g})", figures=figures, details=details,
                                where={"target": t, "output": worst, "node": output_node(ctx.graph, names.index(worst))})]
        note = f"; skipped: {', '.join(f'{k} ({v})' for k, v in skipped.items())}" if skipped else ""
        return [CheckResult(self.name, Status.PASS, f"{len(labels) - 1} targets agree: largest drift from the float64 "
                            f"reference {figures['max_drift']:.3g}{note}", figures=figures, details=details)]

"""The ``custom-ops`` check: every custom op the model uses is registered, and its registration checks pass.

A custom op is one named ``namespace::name`` (``cuvil.register_op``).  The
model's uses are read from its imported graph; when the import fails because
ops are not supported, the unsupported ops outside the standard ONNX domains
and ATen namespaces are the unregistered custom ops, with their nodes.  Each
registered op used has its registration checks run again as the op is
installed now (:func:`cuvil.custom.check_op`: shape and dtype functions
against the reference, symbolic shapes, backward gradients' shapes, and the
C kernel the backends will compile against the reference), so a kernel
replaced or broken after registration fails here, before deployment.
"""

from __future__ import annotations

import re
from typing import Any

from cuvil.errors import UnsupportedOpError
from cuvil.verify.base import Check, CheckResult, Status, register_check

_STANDARD_DOMAINS = frozenset({"", "ai.onnx", "aten", "torch", "cuvil", "prims", "prim"})
# An ATen-style target of a torch custom op: namespace.name.overload
_TORCH_TARGET = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\Z")
_TORCH_STANDARD = frozenset({"aten", "prims", "prim", "_operator", "getitem"})


def unregistered_uses(exc: UnsupportedOpError) -> dict[str, list[str]]:
    """Custom op name -> nodes, for the unsupported ops of an import error that are custom ops."""
    found: dict[str, list[str]] = {}
    for u in exc.uses:
        name = None
        if u.domain not in _STANDARD_DOMAINS and not u.op_type.startswith("tensor type"):
            name = f"{u.domain}::{u.op_type}"
        elif u.domain == "aten" and (m := _TORCH_TARGET.match(u.op_type)) and m.group(1) not in _TORCH_STANDARD:
            name = f"{m.group(1)}::{m.group(2)}"
        if name is not None:
            found.setdefault(name, []).extend(u.nodes)
    return found


@register_check
class CustomOps(Check):
    """Every custom op the model uses is registered, and its registration checks pass as installed now."""

    name = "custom-ops"
    group = "compatibility"
    description = "custom ops used by the model: registered, and their registration checks pass"

    def run(self, ctx: Any) -> list[CheckResult]:
        from cuvil.custom import CustomOpError, check_op, custom_op

        cfg = self.settings(ctx)
        cc = cfg.get("cc")
        try:
            graph = ctx.graph
        except UnsupportedOpError as exc:
            missing = unregistered_uses(exc)
            if not missing:
                return [CheckResult(self.name, Status.SKIP, "the model does not import, and none of its unsupported "
                                    "ops is a custom op (see coverage)", details={"error": str(exc)})]
            first, nodes = next(iter(missing.items()))
            listed = "; ".join(f"{o} (nodes {', '.join(map(repr, ns))})" for o, ns in missing.items())
            return [CheckResult(self.name, Status.FAIL, f"custom ops not registered: {listed}",
                                figures={"unregistered": float(len(missing))},
                                details={"unregistered": {o: list(ns) for o, ns in missing.items()},
                                         "hint": "register them with cuvil.register_op before verifying"},
                                where={"op": first, "node": ", ".join(nodes)})]
        used: dict[str, list[str]] = {}
        for n in graph.walk():
            if "::" in n.op:
                used.setdefault(n.op, []).append(n.name)
        if not used:
            return [CheckResult(self.name, Status.SKIP, "the model uses no custom ops")]
        rows = []
        failures = []
        for op_name, nodes in sorted(used.items()):
            registered = custom_op(op_name)
            row: dict[str, Any] = {"op": op_name, "nodes": nodes, "registered": registered is not None}
            if registered is None:
                row["result"] = "not registered"
                failures.append((op_name, nodes, "declaration", f"custom op {op_name} is not registered"))
            else:
                row.update({"c_kernel": registered.c_function or "none (ref target only)",
                            "backward": registered.backward is not None,
                            "samples": "as registered" if registered.samples is not None else "generated from the schema",
                            "tolerance": registered.tolerance})
                try:
                    check_op(op_name, cc=cc)
                    row["result"] = "pass"
                except CustomOpError as exc:
                    row["result"] = f"{exc.kind} mismatch"
                    row["error"] = str(exc)
                    failures.append((op_name, nodes, exc.kind, str(exc)))
            rows.append(row)
        figures = {"custom_ops": float(len(rows)), "failing": float(len(failures))}
        details = {"ops": rows}
        if failures:
            op_name, nodes, kind, message = failures[0]
            return [CheckResult(self.name, Status.FAIL, message, figures=figures, details=details,
                                where={"op": op_name, "node": ", ".join(nodes), "check": kind})]
        return [CheckResult(self.name, Status.PASS, f"{len(rows)} custom op(s) registered; every registration check "
                            "passes on the kernels installed now", figures=figures, details=details)]

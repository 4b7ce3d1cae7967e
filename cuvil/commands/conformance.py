"""``cuvil conformance``: run ONNX node conformance cases on a target."""

from __future__ import annotations

import argparse
import json

from cuvil.commands.common import cache_dir, reexec_with_sanitizers
from cuvil.errors import CuvilError


def _cmd_conformance(args: argparse.Namespace) -> int:
    from cuvil.conformance import case_dirs, run_cases

    dirs = case_dirs(args.dir, args.filter)
    if not dirs:
        raise CuvilError(f"{args.dir}: no conformance cases found")

    def progress(r: object) -> None:
        if args.verbose:
            from cuvil.conformance import CaseResult

            assert isinstance(r, CaseResult)
            line = f"{r.status:11s} {r.name}"
            if r.status != "pass":
                line += f"  {r.message[:300]}"
            print(line, flush=True)

    from cuvil.backends.registry import find_backend
    from cuvil.conformance import cuvil_runner

    backend = find_backend(args.target)
    if args.sanitize and backend is not None and backend.uses_system_cc and reexec_with_sanitizers():
        return 0  # unreachable: the process was replaced
    runner = cuvil_runner(args.target, sanitize=args.sanitize, cache_dir=cache_dir())
    summary = run_cases(dirs, args.target, runner=runner, progress=progress)
    scope_only = args.scope == "core"
    table = summary.per_op(scope_only)
    print(f"{'op':28s} {'pass':>6s} {'fail':>6s} {'unsup':>6s} {'error':>6s}")
    for op_type, row in table.items():
        print(f"{op_type:28s} {row['pass']:6d} {row['fail']:6d} {row['unsupported']:6d} {row['error']:6d}")
    for label, only in (("all cases", False), ("core op list", True)):
        c = summary.counts(only)
        total = sum(c.values())
        rate = 100.0 * c["pass"] / total if total else 0.0
        print(
            f"{label}: {total} cases, {c['pass']} pass, {c['fail']} fail, "
            f"{c['unsupported']} unsupported, {c['error']} error ({rate:.1f}% pass)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(summary.to_json(), f, indent=1)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    c = sub.add_parser("conformance", help="run ONNX node conformance cases")
    c.add_argument("dir", help="folder of cases (or its parent holding node/)")
    c.add_argument("--target", "-t", default="ref")
    c.add_argument("--filter", "-k", help="regular expression on case names")
    c.add_argument("--scope", choices=("all", "core"), default="all", help="per-op table over all cases or the core op list")
    c.add_argument("--json", help="write per-case results to this file")
    c.add_argument("--verbose", "-v", action="store_true", help="print each case")
    c.add_argument("--sanitize", action="store_true", help="C targets: build with AddressSanitizer and UBSan")
    c.set_defaults(fn=_cmd_conformance)

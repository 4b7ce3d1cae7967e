"""``cuvil opt``: run a pass pipeline on a model's IR and print the result."""

from __future__ import annotations

import argparse
import json
import sys

from cuvil.commands.common import DIM_HELP, dims_of
from cuvil.errors import CuvilError


def _cmd_opt(args: argparse.Namespace) -> int:
    """Run a pass pipeline on a model's IR; print the IR after it, and the pass report on stderr."""
    from cuvil.api import apply_dims, import_model
    from cuvil.ir.printer import print_graph
    from cuvil.passes import DumpIR, Instrument, NumericEach, PassManager, Timing, VerifyEach, default_pipeline

    dims = dims_of(args.dim)
    if args.model.endswith(".cir"):
        from cuvil.ir.parser import parse_graph

        with open(args.model, encoding="utf-8") as f:
            graph = parse_graph(f.read())
        apply_dims(graph, dims)
    else:
        graph = import_model(args.model, dims)
    instruments: list[Instrument] = []
    if args.verify_each:
        instruments.append(VerifyEach())
    if args.numeric_each:
        instruments.append(NumericEach(seed=args.seed, tolerance=args.numeric_tolerance))
    if args.dump_ir:
        instruments.append(DumpIR(args.dump_ir, elide=not args.full))
    if args.timing:
        instruments.append(Timing())
    pipeline = args.passes if args.passes is not None else default_pipeline(args.target)
    pm = PassManager(pipeline, instruments, limit=args.passes_limit)
    try:
        graph = pm.run(graph)
    finally:
        if pm.report is not None:
            print(pm.report.table(), file=sys.stderr)
            if args.report_json:
                with open(args.report_json, "w", encoding="utf-8") as f:
                    json.dump(pm.report.to_json(), f, indent=1)
    if args.emit == "plan":  # the memory plan, at the symbols' maxima (or the values it was laid out at)
        plan = graph.memory_plan
        if plan is None:
            raise CuvilError(f"--emit plan: the pipeline {pm.pipeline!r} has no plan-memory pass")
        text = plan.format(None if plan.bounded else plan.representative)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            print(text, end="")
    if args.emit == "ir":
        text = print_graph(graph, elide=not args.full)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            print(text, end="")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    from cuvil.backends.registry import backends

    targets = [b.name for b in backends()]
    o = sub.add_parser("opt", help="run a pass pipeline on a model's IR and print the result",
                       epilog="the pass report (per pass: changed, seconds, verify, relative L2 error) goes to stderr")
    o.add_argument("model", help="an ONNX model file, or Cuvil IR text (.cir)")
    o.add_argument("--passes", "-p", metavar="PIPELINE",
                   help="pipeline text, e.g. canonicalize,fold-constants,cse,dce (default: the target's pipeline)")
    o.add_argument("--target", "-t", default="native", choices=targets, help="whose default pipeline (default native)")
    o.add_argument("--dim", action="append", metavar="NAME=SPEC", help=DIM_HELP)
    o.add_argument("--emit", choices=("ir", "plan", "none"), default="ir",
                   help="what to print: the IR after the passes, the memory plan (plan-memory), or nothing")
    o.add_argument("--full", action="store_true", help="print (and dump) every constant, so the text parses back")
    o.add_argument("--output", "-o", metavar="FILE", help="write the IR to this file instead of stdout")
    o.add_argument("--verify-each", action="store_true", help="run the IR verifier after every pass")
    o.add_argument("--numeric-each", action="store_true",
                   help="run the reference interpreter on seeded inputs after every pass; report each pass's error")
    o.add_argument("--seed", type=int, default=0, help="seed of the --numeric-each inputs")
    o.add_argument("--numeric-tolerance", type=float, metavar="TOL",
                   help="with --numeric-each: stop at the first pass whose relative L2 error exceeds TOL")
    o.add_argument("--dump-ir", metavar="DIR", help="write the IR before and after every pass: DIR/003-cse.cir")
    o.add_argument("--timing", action="store_true", help="time every pass")
    o.add_argument("--passes-limit", type=int, metavar="N", help="run only the first N passes")
    o.add_argument("--report-json", metavar="FILE", help="write the pass report as JSON")
    o.set_defaults(fn=_cmd_opt)

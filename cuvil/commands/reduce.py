"""``cuvil reduce``: from a model that fails a check to a minimal repro folder, and its replay."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cuvil.commands.common import cache_dir
from cuvil.errors import CuvilError


def _faults(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in text.split(",") if x.strip()]


def _cmd_reduce(args: argparse.Namespace) -> int:
    """Reduce (exit 0 once the repro is written) or replay (exit 1 while the failure is there, 0 once fixed)."""
    from cuvil.reduce.repro import replay
    from cuvil.reduce.run import reduce_model

    if args.replay is not None:
        if args.model is not None:
            raise CuvilError("cuvil reduce --replay DIR takes no MODEL")
        failing, outcome, sig = replay(Path(args.replay), _faults(args.faults))
        state = "still fails" if failing else "no longer fails"
        print(f"{args.replay}: {state} ({sig.kind} signature on {sig.target}): {outcome.describe()}")
        return 1 if failing else 0
    if args.model is None or args.output is None:
        raise CuvilError("cuvil reduce needs MODEL and -o DIR (or --replay DIR)")
    if args.check is None:
        raise CuvilError("cuvil reduce needs --check CHECK (the check that failed, e.g. layerwise)")

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    result = reduce_model(args.model, args.output, check=args.check, target=args.target, inputs=args.inputs,
                          faults=_faults(args.faults) or (), threshold=args.threshold, timeout=args.timeout,
                          cache_dir=cache_dir(), progress=progress, subject=args.subject)
    print(f"reduced {result.original_size} -> {result.size} nodes in {result.tried} candidates "
          f"({result.seconds:.1f} s): {result.outcome.describe()}")
    print(f"repro in {args.output}; replay: cuvil reduce --replay {args.output}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    from cuvil.reduce.signature import CHECKS, DEFAULT_THRESHOLD

    r = sub.add_parser("reduce", help="reduce a model that fails a check to a minimal repro folder",
                       epilog="exit status: reducing, 0 once the repro is written; --replay, 1 while the failure "
                              "is there and 0 once it is fixed; 2 a usage or input error; environment: "
                              "CUVIL_CACHE_DIR is the build cache folder")
    r.add_argument("model", nargs="?", help="an ONNX model file or a .cir file")
    r.add_argument("--check", choices=CHECKS,
                   help="the failing check; each is re-checked as the target's outputs against the reference "
                        "interpreter on the recorded inputs")
    r.add_argument("--target", default="native", help="the target the check failed on (default: native)")
    r.add_argument("--subject", choices=["onnxruntime"],
                   help="reduce a disagreement of an onnxruntime session (on the ONNX model) with the reference "
                        "instead of a Cuvil build's")
    r.add_argument("--inputs", metavar="X.npz", help="the failing inputs, keyed by input name (default: seeded random)")
    r.add_argument("-o", "--output", metavar="DIR", help="the repro folder to write")
    r.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help=f"a mismatch is a relative L2 error above this (default {DEFAULT_THRESHOLD:g})")
    r.add_argument("--timeout", type=float, default=120.0, help="seconds each candidate may take (a hang past it "
                                                                  "is a signature; default 120)")
    r.add_argument("--faults", metavar="A,B", help="planted faults (cuvil.faults) to compile with; with --replay "
                                                   "they replace the recorded ones ('' for none)")
    r.add_argument("--replay", metavar="DIR", help="replay a repro folder instead of reducing")
    r.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    r.set_defaults(fn=_cmd_reduce)

"""``cuvil verify``: the pre-deployment verification checks on one model."""

from __future__ import annotations

import argparse
import sys

from cuvil.commands.common import cache_dir


def _cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification suite; exit 0 when every check passed, 1 when one failed (2: usage errors)."""
    from cuvil.verify import verify
    from cuvil.verify.runner import Progress

    def names(text: str | None) -> list[str] | None:
        return [x.strip() for x in text.split(",") if x.strip()] if text is not None else None

    report = verify(args.model, checks=names(args.checks), targets=names(args.targets), config=args.config,
                    report_dir=args.report_dir, strict=True if args.strict else None, baseline=args.baseline,
                    save_baseline=args.save_baseline, subject=args.subject, trace=args.trace,
                    memory_limit=args.memory_limit, inputs=args.inputs, cache_dir=cache_dir(),
                    progress=Progress() if not args.quiet else False)
    if args.report_dir:
        print(f"reports in {args.report_dir}: report.json, junit.xml, summary.md, report.html", file=sys.stderr)
    print(report.verdict)
    return report.exit_status


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    v = sub.add_parser("verify", help="run the pre-deployment verification checks on a model",
                       epilog="exit status: 0 every check passed, 1 a check failed (or warned, with --strict), "
                              "2 a usage or input error; environment: CUVIL_CACHE_DIR is the build cache folder")
    v.add_argument("model", help="an ONNX model file, a TensorFlow SavedModel folder or .keras file, or "
                                 "path/to/file.py:factory returning (module, input_spec[, dynamic_shapes]) for a "
                                 "PyTorch module or (model, input_spec) for a Keras model")
    v.add_argument("--config", metavar="FILE",
                   help="cuvil.toml or pyproject.toml ([tool.cuvil.verify]); default: the nearest one found from here")
    v.add_argument("--checks", metavar="A,B", help="checks or groups to run, e.g. compat,layerwise (default: all)")
    v.add_argument("--targets", metavar="A,B", help="targets, e.g. ref,native, or all (default: ref,native)")
    v.add_argument("--report-dir", metavar="DIR", help="write report.json, junit.xml, summary.md and report.html here")
    v.add_argument("--strict", action="store_true", help="warnings fail too")
    v.add_argument("--save-baseline", metavar="FILE", help="store this run's figures as a baseline")
    v.add_argument("--baseline", metavar="FILE", help="fail on figures that regressed against this baseline")
    v.add_argument("--subject", default="cuvil",
                   help="what to verify: cuvil (its compiled builds; the default) or onnxruntime (a session on the "
                        "ONNX model, every graph optimisation on)")
    v.add_argument("--trace", metavar="FILE", help="write the latency check's Chrome trace here (opens in Perfetto)")
    v.add_argument("--memory-limit", metavar="SIZE",
                   help="the batch-scaling check's memory limit: bytes, or a size such as 512M or 2GiB")
    v.add_argument("--inputs", metavar="DIR",
                   help="real input samples, the checks' first source of inputs: a folder of .npz files, one sample "
                        "each, keyed by input name or arr_0, arr_1... in input order (as for --calibration)")
    v.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    v.set_defaults(fn=_cmd_verify)

"""The ``cuvil`` command line: compile and run here, the other commands from ``cuvil.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from cuvil.commands.common import (
    DIM_HELP,
    SPEC_HELP,
    compile_model,
    compiled_note,
    configure_toolkits,
    describe,
    input_spec,
)
from cuvil.commands.common import parse_dim as parse_dim
from cuvil.errors import CuvilError

#: The command modules (``cuvil/commands/``), each adding its parser with ``register(sub)``; after
#: compile and run in ``--help`` (inspect comes first).
COMMANDS = ("cuvil.commands.opt", "cuvil.commands.verify", "cuvil.commands.verify_fleet", "cuvil.commands.conformance",
            "cuvil.commands.reduce")


def _quant_options(args: argparse.Namespace) -> dict[str, Any]:
    """``cuvil compile``'s int8 and reduced-precision options as cuvil.compile keywords."""
    options = _precision_options(args)
    if args.quantize is None:
        given = [f for f, v in (("--asymmetric", args.asymmetric), ("--per-tensor", args.per_tensor),
                                ("--[no-]reduce-range", args.reduce_range is not None),
                                ("--min-calibration-samples", args.min_calibration_samples)) if v]
        if given:
            raise CuvilError(f"{', '.join(given)} apply with --quantize int8")
        if args.calibration and args.precision == "fp32":
            raise CuvilError("--calibration applies with --quantize int8 or --precision fp16/bf16")
        return {**options, "calibration_dataset": args.calibration} if args.calibration else options
    return {**options, "quant_dtype": args.quantize, "calibration_dataset": args.calibration,
            "symmetric": not args.asymmetric, "per_channel": not args.per_tensor, "calibration": args.calibration_method,
            "min_calibration_samples": args.min_calibration_samples, "reduce_range": args.reduce_range}


def _precision_options(args: argparse.Namespace) -> dict[str, Any]:
    """--precision, --precision-override and --allow-overflow as cuvil.compile keywords."""
    if args.precision == "fp32":
        given = [f for f, v in (("--precision-override", args.precision_override),
                                ("--allow-overflow", args.allow_overflow)) if v]
        if given:
            raise CuvilError(f"{', '.join(given)} apply with --precision fp16 or bf16")
        return {}
    overrides: dict[str, str] = {}
    for text in args.precision_override or ():
        key, eq, dtype = text.partition("=")
        if not eq or not key.strip() or not dtype.strip():
            raise CuvilError(f"--precision-override {text!r}: expected OP=TYPE or node:NAME=TYPE, e.g. softmax=fp16 "
                             "or node:encoder.0.attn=fp32")
        overrides[key.strip()] = dtype.strip()
    return {"precision": args.precision, "precision_overrides": overrides or None,
            "allow_overflow": args.allow_overflow}


def _cmd_compile(args: argparse.Namespace) -> int:
    m = compile_model(args.model, args.target, args.dim, **_quant_options(args), **input_spec(args.input_spec))
    print(f"compiled {args.model} for {m.target} {compiled_note(m)}")
    describe(m)
    if args.output:
        folder = m.save(args.output)
        files = sorted(p.name for p in folder.iterdir())
        print(f"saved to {folder}: {', '.join(files)}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import numpy as np

    from cuvil.ir.dtypes import is_float_np

    t0 = time.perf_counter()
    from cuvil.frontends.tensorflow import is_tensorflow_path

    if Path(args.model).is_dir() and not is_tensorflow_path(args.model):  # an artifact, not a SavedModel
        from cuvil.runtime.artifact import load

        if args.dim:
            raise CuvilError("--dim applies when compiling a model; a saved artifact keeps the dims it was compiled with")
        if args.input_spec:
            raise CuvilError("--input-spec applies when compiling a model; a saved artifact keeps its inputs")
        m = load(args.model)
        if args.target is not None and args.target != m.target:
            raise CuvilError(f"{args.model} was compiled for target {m.target!r}, not {args.target!r}")
        how = f"loaded {args.model} ({m.target}) in {time.perf_counter() - t0:.3f} s"
    else:
        m = compile_model(args.model, args.target or "ref", args.dim, **input_spec(args.input_spec))
        how = f"compiled {args.model} for {m.target} {compiled_note(m)}"
    for name in m.output_names if args.output else ():  # an .npz is a zip: a member's name (NAME.npy) fits 16 bits
        if len(name.encode("utf-8", errors="surrogatepass")) + 4 > 0xFFFF:
            raise CuvilError(f"-o {args.output}: output {name[:40]!r}... has a name of {len(name):,} characters, "
                             "too long for an .npz member (65,531 bytes at most)")
    limits = {"max_loop_iterations": args.max_loop_iterations, "max_output_bytes": args.max_output_bytes}
    t1 = time.perf_counter()
    if args.inputs:
        with np.load(args.inputs) as data:
            feeds = {k: data[k] for k in data.files}
        outs = m.run(feeds, **limits)
    else:
        import math

        from cuvil.ir.dim_domains import analyse_dims
        from cuvil.ir.domains import infer_domains
        from cuvil.ir.samples import random_inputs, sample_shapes

        # symbols where the graph is valid (every window fits, reshapes divide), where it is at hand
        dims = analyse_dims(m.graph).sample_env() if m.graph is not None else None
        # Random samples are drawn in float64 before the cast: refuse what would not fit in memory
        # (a shape declared huge, or a model that fixes a batch of millions) instead of failing in NumPy.
        limit = 1 << 28
        for spec, shape in zip(m.input_specs, sample_shapes(m.input_specs, m.symbols, dims)):
            count = math.prod(shape)
            if count > limit:
                fix = ("pass --inputs FILE.npz, or compile the model with smaller dims (--dim NAME=N for its "
                       "symbols)" if Path(args.model).is_dir() else
                       "pass --inputs FILE.npz, or --dim NAME=N for a symbolic dim")
                raise CuvilError(f"--random: input {spec.name!r} of shape {shape} holds {count:,} elements "
                                 f"(random samples hold at most {limit:,}); {fix}")
        # token ids within their tables, masks as masks, where the compiled graph is at hand
        domains = infer_domains(m.graph) if m.graph is not None else {}
        arrays = random_inputs(m.input_specs, m.symbols, seed=args.seed, values=dims,
                               domains=[domains.get(s.name) for s in m.input_specs])
        outs = m.run(dict(zip(m.input_names, arrays)), **limits)
    t2 = time.perf_counter()
    print(f"{how}; ran in {t2 - t1:.3f} s")
    for name, a in outs.items():
        stats = ""
        if a.size and (is_float_np(a.dtype) or a.dtype.kind in "iub"):
            f = a.astype(np.float64)
            stats = f" min {f.min():.6g} max {f.max():.6g} mean {f.mean():.6g}"
        print(f"  {name}: {a.dtype}{list(a.shape)}{stats}")
    if args.output:
        np.savez(args.output, **outs)
        print(f"wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuvil", description="Cuvil: an ahead-of-time compiler for AI inference.")
    sub = p.add_subparsers(dest="command", required=True)
    importlib.import_module("cuvil.commands.inspect").register(sub)

    from cuvil.backends.registry import backends

    built = [b.name for b in backends() if b.builds]  # what `compile -o` can save

    cc = sub.add_parser("compile", help="compile a model, and save it as an artifact folder (-o)",
                        epilog="environment: CC is the C compiler, CUVIL_CACHE_DIR the build cache folder")
    cc.add_argument("model", help="an ONNX model file, a TorchScript file (.pt/.pth from torch.jit.save), a TensorFlow "
                                  "SavedModel folder or a .keras file")
    cc.add_argument("--target", "-t", default="native", help=f"one of {', '.join(built)} (default native)")
    cc.add_argument("--dim", action="append", metavar="NAME=SPEC", help=DIM_HELP)
    cc.add_argument("--input-spec", action="append", metavar="SHAPE[:DTYPE]", help=SPEC_HELP)
    cc.add_argument("--output", "-o", metavar="DIR", help="save the compiled model to this folder")
    cc.add_argument("--quantize", choices=["int8"], help="post-training quantization (needs --calibration)")
    cc.add_argument("--calibration", metavar="DIR",
                    help="calibration samples: a folder of .npz files, one sample each, keyed by input name "
                         "(or arr_0, arr_1... in input order)")
    cc.add_argument("--calibration-method", choices=["minmax", "percentile", "entropy"], default="minmax",
                    help="how activation ranges are chosen (default minmax)")
    cc.add_argument("--asymmetric", action="store_true", help="uint8 activations with a zero point (default: "
                                                              "symmetric int8)")
    cc.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor (default: per channel)")
    cc.add_argument("--reduce-range", action=argparse.BooleanOptionalAction, default=None,
                    help="7-bit weights in [-64, 64] (default: where the target's int8 kernels gain from them, "
                         "AVX2 without AVX-512)")
    cc.add_argument("--min-calibration-samples", type=int, metavar="N",
                    help="accept fewer than 64 calibration samples (at least N)")
    cc.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32",
                    help="store weights and compute in fp16 or bf16, accumulating products in float32 and keeping "
                         "softmax, normalisations and reductions in float32 (default fp32); with --calibration, "
                         "every example is checked for fp16 overflow")
    cc.add_argument("--precision-override", action="append", metavar="KEY=TYPE",
                    help="with --precision: the type of an op or a node, e.g. softmax=fp16 or "
                         "node:encoder.0.attn=fp32 (repeatable; a node's entry wins)")
    cc.add_argument("--allow-overflow", action="store_true",
                    help="with --precision fp16: compile even where a value overflows fp16 (recorded in the "
                         "model's precision report) instead of refusing")
    cc.set_defaults(fn=_cmd_compile)

    r = sub.add_parser("run", help="run a saved artifact, or compile a model and run it, once",
                       epilog="environment: CC is the C compiler, CUVIL_CACHE_DIR the build cache folder")
    r.add_argument("model", help="an artifact folder (from `cuvil compile -o`), an ONNX model file, a TorchScript "
                                 "file, a TensorFlow SavedModel folder or a .keras file")
    r.add_argument("--target", "-t", help="for a model file: the target (default ref); for an artifact: must match it")
    r.add_argument("--dim", action="append", metavar="NAME=SPEC", help="for a model file: " + DIM_HELP)
    r.add_argument("--input-spec", action="append", metavar="SHAPE[:DTYPE]", help=SPEC_HELP)
    src = r.add_mutually_exclusive_group()
    src.add_argument("--inputs", help=".npz file with one array per input name")
    src.add_argument("--random", action="store_true", help="seeded random inputs (the default)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--output", "-o", help="write outputs to this .npz file")
    r.add_argument("--max-loop-iterations", type=int, metavar="N",
                   help="fail the run when a loop would run more than N iterations (default: no limit)")
    r.add_argument("--max-output-bytes", type=int, metavar="B",
                   help="fail the run when a value a loop builds would hold more than B bytes (default: no limit)")
    r.set_defaults(fn=_cmd_run)

    for name in COMMANDS:
        importlib.import_module(name).register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configure_toolkits()
        code: int = args.fn(args)
        return code
    except CuvilError as exc:
        print(f"cuvil: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cuvil: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The ``cuvil`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cuvil.errors import CuvilError

if TYPE_CHECKING:
    from cuvil.api import DimConstraint
    from cuvil.runtime.compiled import CompiledModel


def _reexec_with_sanitizers() -> bool:
    """Sanitized libraries need the sanitizer runtimes loaded first: restart under LD_PRELOAD."""
    if "libasan" in os.environ.get("LD_PRELOAD", ""):
        return False
    import subprocess

    libs = []
    for name in ("libasan.so", "libubsan.so"):
        r = subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True)
        path = r.stdout.strip()
        if r.returncode != 0 or not os.path.isabs(path):
            raise CuvilError(f"--sanitize needs the C compiler's {name}, which was not found")
        libs.append(path)
    env = dict(os.environ, LD_PRELOAD=":".join(libs), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "cuvil", *sys.argv[1:]], env)
    return True


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
    if args.sanitize and backend is not None and backend.uses_system_cc and _reexec_with_sanitizers():
        return 0  # unreachable: the process was replaced
    runner = cuvil_runner(args.target, sanitize=args.sanitize, cache_dir=os.environ.get("CUVIL_CACHE_DIR"))
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


def _op_counts(proto: object) -> dict[tuple[str, str], int]:
    import onnx

    assert isinstance(proto, onnx.ModelProto)
    counts: dict[tuple[str, str], int] = {}

    def walk(g: onnx.GraphProto) -> None:
        for n in g.node:
            key = ("" if n.domain in ("", "ai.onnx") else n.domain, n.op_type)
            counts[key] = counts.get(key, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(proto.graph)
    return counts


def _cmd_inspect(args: argparse.Namespace) -> int:
    from cuvil.frontends.onnx import load_onnx, read_model
    from cuvil.frontends.onnx.importer import find_importer
    from cuvil.ir.printer import format_type, print_graph

    if args.model is None and args.precision not in (None, "", "fp16", "bf16", "int8"):
        args.model, args.precision = args.precision, ""  # `inspect --precision ART`: the value is the model
    if args.model is None:
        raise CuvilError("inspect needs a MODEL: an ONNX file (or, with --precision, a saved artifact's folder)")
    if args.precision is not None:
        return _inspect_precision(args)
    proto, _ = read_model(args.model)
    counts = _op_counts(proto)
    if args.ir:
        print(print_graph(load_onnx(proto), elide=not args.full), end="")
        return 0
    graph = None
    try:
        graph = load_onnx(proto)
    finally:
        opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import)
        print(f"model: {args.model}")
        print(f"producer: {proto.producer_name or '-'} {proto.producer_version}".rstrip())
        print(f"ir_version: {proto.ir_version}; opsets: {opsets}")
        if graph is not None:
            consts = graph.constants()
            params = sum(int(a.size) for a in consts.values())
            nbytes = sum(int(a.nbytes) for a in consts.values())
            print(f"graph: {graph.name}: {sum(1 for _ in graph.walk())} nodes, {len(consts)} constants "
                  f"({params:,} elements, {nbytes / 2**20:.2f} MiB)")
            for v in graph.inputs:
                print(f"  input  {v.name}: {format_type(v.type)}")
            for v in graph.outputs:
                print(f"  output {v.name}: {format_type(v.type)}")
            for info in graph.symbols.values():
                print(f"  symbol {info.name}: {info.describe() or 'unconstrained'}")
        print()
        print(f"{'op type':32s} {'count':>6s}  supported")
        for (dom, op_type), n in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            label = f"{dom}::{op_type}" if dom else op_type
            ok = find_importer(dom, op_type) is not None
            print(f"{label:32s} {n:6d}  {'yes' if ok else 'NO'}")
    return 0


def _inspect_precision(args: argparse.Namespace) -> int:
    """The per-layer error report of a saved artifact, or of compiling a model at ``--precision``."""
    from pathlib import Path

    from cuvil.quant.accuracy import PrecisionReport, format_report

    path = Path(args.model)
    quantization = None  # an int8 artifact's options
    if path.is_dir():
        if not (path / "meta.json").is_file():
            raise CuvilError(f"{path} is not a saved model: it holds no meta.json")
        meta = json.loads((path / "meta.json").read_text())
        data = meta.get("compile", {}).get("precision")
        if data is None:
            raise CuvilError(f"{path} was compiled in float32: it has no precision report")
        report = PrecisionReport.from_json(data)
        quantization = data.get("quantization")
        if args.precision and args.precision != report.precision:
            raise CuvilError(f"{path} was compiled at precision {report.precision}, not {args.precision}: its report "
                             f"is printed by --precision alone or --precision {report.precision}")
    else:
        import cuvil

        if args.precision == "int8":
            raise CuvilError("an int8 report needs calibration data: compile with `cuvil compile --quantize int8 "
                             "--calibration DIR -o ART`, then run `cuvil inspect --precision ART`")
        m = cuvil.compile(str(path), target="ref", precision=args.precision or "fp16")
        assert m.info.precision is not None
        report = PrecisionReport.from_json(m.info.precision)
    print(format_report(report, args.top, quantization))
    return 0


# ---- compile and run ------------------------------------------------------------------------------------------
# The CLI is the one place that reads the environment: CC (the C compiler) and CUVIL_CACHE_DIR (the build cache).


def _compile(model: str, target: str, dim_args: Sequence[str] | None, **options: Any) -> CompiledModel:
    """cuvil.compile, with ``cache_dir=`` from CUVIL_CACHE_DIR and, for the C targets, ``cc=`` from CC.

    Unset or empty variables leave the defaults. CC names the system C compiler, so it does not apply to
    targets built with another toolchain (wasm32 builds with zig cc)."""
    from cuvil.api import compile as cuvil_compile
    from cuvil.backends.registry import get_backend

    cc = os.environ.get("CC") or None
    uses_cc = get_backend(target).uses_system_cc
    return cuvil_compile(model, target=target, dims=_dims(dim_args), cc=cc if uses_cc else None,
                         cache_dir=os.environ.get("CUVIL_CACHE_DIR") or None, **options)


def parse_dim(text: str) -> tuple[str, DimConstraint]:
    """One ``--dim`` value as a ``dims=`` entry of cuvil.compile.

    ``NAME=SPEC[,SPEC...]``, each SPEC one of ``LO:HI`` (a range; either end may be left out),
    ``N`` (a fixed value) or ``%N`` (a multiple of N): ``batch=1:256``, ``h=%32``, ``h=%32,32:1024``."""
    from cuvil.api import multiple_of

    name, eq, spec = text.partition("=")
    name = name.strip()
    if not eq or not name or not spec.strip():
        raise CuvilError(f"--dim {text!r}: expected NAME=SPEC, e.g. batch=1:256, h=%32 or seq=128")

    def number(part: str, what: str) -> int:
        try:
            return int(part)
        except ValueError:
            raise CuvilError(f"--dim {text!r}: {what} {part!r} is not an integer") from None

    lo: int | None = None
    hi: int | None = None
    multiple: int | None = None
    fixed: int | None = None
    for part in (x.strip() for x in spec.split(",")):
        if part.startswith("%"):
            multiple = number(part[1:], "multiple")
            if multiple <= 0:
                raise CuvilError(f"--dim {text!r}: the multiple must be positive")
        elif ":" in part:
            a, _, b = part.partition(":")
            lo = number(a, "minimum") if a.strip() else None
            hi = number(b, "maximum") if b.strip() else None
        else:
            fixed = number(part, "value")
    if fixed is not None and (lo is not None or hi is not None or multiple is not None):
        raise CuvilError(f"--dim {text!r}: a fixed value cannot be combined with a range or a multiple")
    if fixed is not None:
        return name, fixed
    if multiple is not None:
        return name, multiple_of(multiple, lo, hi)
    return name, (lo, hi)


def _dims(values: Sequence[str] | None) -> dict[str, DimConstraint]:
    dims: dict[str, DimConstraint] = {}
    for text in values or ():
        name, c = parse_dim(text)
        if name in dims:
            raise CuvilError(f"--dim {name} is given twice")
        dims[name] = c
    return dims


def _describe(m: CompiledModel) -> None:
    from cuvil.ir.printer import format_type

    for s in m.input_specs:
        print(f"  input  {s.name}: {format_type(s.type)}")
    for s in m.output_specs:
        print(f"  output {s.name}: {format_type(s.type)}")
    for info in m.symbols.values():
        print(f"  symbol {info.name}: {info.describe() or 'unconstrained'}")


def _compiled(m: CompiledModel) -> str:
    """How a compile went, e.g. "in 1.234 s (built)" or "in 0.045 s (from the build cache)"."""
    how = {None: "", True: " (from the build cache)", False: " (built)"}[m.info.cached]
    return f"in {m.info.seconds or 0.0:.3f} s{how}"


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


def _input_spec(values: Sequence[str] | None) -> dict[str, Any]:
    """``--input-spec`` values (a TorchScript model's inputs, in order) as cuvil.compile's ``input_spec=``."""
    from cuvil.ir.spec import parse_spec

    return {"input_spec": [parse_spec(t) for t in values]} if values else {}


def _cmd_compile(args: argparse.Namespace) -> int:
    m = _compile(args.model, args.target, args.dim, **_quant_options(args), **_input_spec(args.input_spec))
    print(f"compiled {args.model} for {m.target} {_compiled(m)}")
    _describe(m)
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
    if Path(args.model).is_dir():
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
        m = _compile(args.model, args.target or "ref", args.dim, **_input_spec(args.input_spec))
        how = f"compiled {args.model} for {m.target} {_compiled(m)}"
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


def _cmd_opt(args: argparse.Namespace) -> int:
    """Run a pass pipeline on a model's IR; print the IR after it, and the pass report on stderr."""
    from cuvil.api import apply_dims, import_model
    from cuvil.ir.printer import print_graph
    from cuvil.passes import DumpIR, Instrument, NumericEach, PassManager, Timing, VerifyEach, default_pipeline

    dims = _dims(args.dim)
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


def _cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification suite; exit 0 when every check passed, 1 when one failed (2: usage errors)."""
    from cuvil.verify import verify
    from cuvil.verify.runner import Progress

    def names(text: str | None) -> list[str] | None:
        return [x.strip() for x in text.split(",") if x.strip()] if text is not None else None

    report = verify(args.model, checks=names(args.checks), targets=names(args.targets), config=args.config,
                    report_dir=args.report_dir, strict=True if args.strict else None, baseline=args.baseline,
                    save_baseline=args.save_baseline, subject=args.subject, trace=args.trace,
                    memory_limit=args.memory_limit, inputs=args.inputs, cache_dir=os.environ.get("CUVIL_CACHE_DIR") or None,
                    progress=Progress() if not args.quiet else False)
    if args.report_dir:
        print(f"reports in {args.report_dir}: report.json, junit.xml, summary.md, report.html", file=sys.stderr)
    print(report.verdict)
    return report.exit_status


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuvil", description="Cuvil: an ahead-of-time compiler for AI inference.")
    sub = p.add_subparsers(dest="command", required=True)

    i = sub.add_parser("inspect", help="print a model's graph summary and op coverage")
    i.add_argument("model", nargs="?", help="an ONNX model file (with --precision: or a saved artifact's folder)")
    i.add_argument("--ir", action="store_true", help="print the Cuvil IR text")
    i.add_argument("--full", action="store_true", help="with --ir, print every constant (parsable text)")
    i.add_argument("--precision", nargs="?", const="", metavar="fp16|bf16|int8",
                   help="the worst layers of a reduced-precision or int8 artifact's accuracy report (the value, "
                        "when given, must be the artifact's), or of compiling MODEL at fp16 or bf16 (default "
                        "fp16)")
    i.add_argument("--top", type=int, default=10, help="with --precision, how many layers to print")
    i.set_defaults(fn=_cmd_inspect)

    from cuvil.backends.registry import backends

    targets = [b.name for b in backends()]
    built = [b.name for b in backends() if b.builds]  # what `compile -o` can save

    dim_help = "constrain a symbolic dim: NAME=LO:HI, NAME=N or NAME=%%N (a multiple), combined with commas"
    spec_help = ("a TorchScript model's input, once per input in order: dims separated by commas (ints or symbol "
                 "names), then the element type: 1,3,224,224 or batch,128:int64 (default float32)")
    cc = sub.add_parser("compile", help="compile a model, and save it as an artifact folder (-o)",
                        epilog="environment: CC is the C compiler, CUVIL_CACHE_DIR the build cache folder")
    cc.add_argument("model", help="an ONNX model file, or a TorchScript file (.pt/.pth from torch.jit.save)")
    cc.add_argument("--target", "-t", default="native", help=f"one of {', '.join(built)} (default native)")
    cc.add_argument("--dim", action="append", metavar="NAME=SPEC", help=dim_help)
    cc.add_argument("--input-spec", action="append", metavar="SHAPE[:DTYPE]", help=spec_help)
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
    r.add_argument("model", help="an artifact folder (from `cuvil compile -o`), an ONNX model file or a TorchScript "
                                 "file")
    r.add_argument("--target", "-t", help="for a model file: the target (default ref); for an artifact: must match it")
    r.add_argument("--dim", action="append", metavar="NAME=SPEC", help="for a model file: " + dim_help)
    r.add_argument("--input-spec", action="append", metavar="SHAPE[:DTYPE]", help=spec_help)
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

    o = sub.add_parser("opt", help="run a pass pipeline on a model's IR and print the result",
                       epilog="the pass report (per pass: changed, seconds, verify, relative L2 error) goes to stderr")
    o.add_argument("model", help="an ONNX model file, or Cuvil IR text (.cir)")
    o.add_argument("--passes", "-p", metavar="PIPELINE",
                   help="pipeline text, e.g. canonicalize,fold-constants,cse,dce (default: the target's pipeline)")
    o.add_argument("--target", "-t", default="native", choices=targets, help="whose default pipeline (default native)")
    o.add_argument("--dim", action="append", metavar="NAME=SPEC", help=dim_help)
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

    v = sub.add_parser("verify", help="run the pre-deployment verification checks on a model",
                       epilog="exit status: 0 every check passed, 1 a check failed (or warned, with --strict), "
                              "2 a usage or input error; environment: CUVIL_CACHE_DIR is the build cache folder")
    v.add_argument("model", help="an ONNX model file, or path/to/file.py:factory returning (module, input_spec[, dynamic_shapes])")
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

    c = sub.add_parser("conformance", help="run ONNX node conformance cases")
    c.add_argument("dir", help="folder of cases (or its parent holding node/)")
    c.add_argument("--target", "-t", default="ref")
    c.add_argument("--filter", "-k", help="regular expression on case names")
    c.add_argument("--scope", choices=("all", "core"), default="all", help="per-op table over all cases or the core op list")
    c.add_argument("--json", help="write per-case results to this file")
    c.add_argument("--verbose", "-v", action="store_true", help="print each case")
    c.add_argument("--sanitize", action="store_true", help="C targets: build with AddressSanitizer and UBSan")
    c.set_defaults(fn=_cmd_conformance)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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

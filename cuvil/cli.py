"""The ``cuvil`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from cuvil.errors import CuvilError


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

    from cuvil.conformance import cuvil_runner

    if args.sanitize and args.target != "ref" and _reexec_with_sanitizers():
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


def _cmd_run(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from cuvil.api import compile as cuvil_compile

    t0 = time.perf_counter()
    m = cuvil_compile(args.model, target=args.target)
    t1 = time.perf_counter()
    if args.inputs:
        with np.load(args.inputs) as data:
            feeds = {k: data[k] for k in data.files}
        outs = m.run(feeds)
    else:
        from cuvil.runtime.samples import random_inputs

        arrays = random_inputs(m.input_specs, m.symbols, seed=args.seed)
        outs = dict(zip(m.output_names, m(*arrays)))
    t2 = time.perf_counter()
    print(f"compiled {args.model} for {m.target} in {t1 - t0:.3f} s; ran in {t2 - t1:.3f} s")
    for name, a in outs.items():
        stats = ""
        if a.size and a.dtype.kind in "fiub":
            f = a.astype(np.float64)
            stats = f" min {f.min():.6g} max {f.max():.6g} mean {f.mean():.6g}"
        print(f"  {name}: {a.dtype}{list(a.shape)}{stats}")
    if args.output:
        np.savez(args.output, **outs)  # type: ignore[arg-type]
        print(f"wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cuvil", description="Cuvil: an ahead-of-time compiler for AI inference.")
    sub = p.add_subparsers(dest="command", required=True)

    i = sub.add_parser("inspect", help="print a model's graph summary and op coverage")
    i.add_argument("model", help="an ONNX model file")
    i.add_argument("--ir", action="store_true", help="print the Cuvil IR text")
    i.add_argument("--full", action="store_true", help="with --ir, print every constant (parsable text)")
    i.set_defaults(fn=_cmd_inspect)

    r = sub.add_parser("run", help="compile a model and run it once")
    r.add_argument("model", help="an ONNX model file")
    r.add_argument("--target", "-t", default="ref")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--inputs", help=".npz file with one array per input name")
    src.add_argument("--random", action="store_true", help="random inputs (the default)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--output", "-o", help="write outputs to this .npz file")
    r.set_defaults(fn=_cmd_run)

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

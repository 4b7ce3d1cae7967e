"""``cuvil inspect``: a model's graph summary and op coverage, its IR, or a precision report."""

from __future__ import annotations

import argparse
import json

from cuvil.commands.common import print_signature
from cuvil.errors import CuvilError


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
    from cuvil.ir.printer import print_graph

    if args.model is None and args.precision not in (None, "", "fp16", "bf16", "int8"):
        args.model, args.precision = args.precision, ""  # `inspect --precision ART`: the value is the model
    if args.model is None:
        raise CuvilError("inspect needs a MODEL: an ONNX file (or, with --precision, a saved artifact's folder)")
    if args.precision is not None:
        return _inspect_precision(args)
    from cuvil.frontends.tensorflow import is_tensorflow_path, to_onnx

    # a SavedModel folder or .keras file: the ONNX model tf2onnx converts it to
    proto = to_onnx(args.model) if is_tensorflow_path(args.model) else read_model(args.model)[0]
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
            print_signature(graph.inputs, graph.outputs, graph.symbols)
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

    from cuvil.frontends.tensorflow import is_tensorflow_path
    from cuvil.quant.accuracy import PrecisionReport, format_report

    path = Path(args.model)
    quantization = None  # an int8 artifact's options
    if path.is_dir() and not is_tensorflow_path(path):  # an artifact, not a SavedModel
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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the command's parser to the ``cuvil`` command line."""
    i = sub.add_parser("inspect", help="print a model's graph summary and op coverage")
    i.add_argument("model", nargs="?", help="an ONNX model file, a TensorFlow SavedModel folder or .keras file (its "
                                            "tf2onnx conversion), or with --precision a saved artifact's folder")
    i.add_argument("--ir", action="store_true", help="print the Cuvil IR text")
    i.add_argument("--full", action="store_true", help="with --ir, print every constant (parsable text)")
    i.add_argument("--precision", nargs="?", const="", metavar="fp16|bf16|int8",
                   help="the worst layers of a reduced-precision or int8 artifact's accuracy report (the value, "
                        "when given, must be the artifact's), or of compiling MODEL at fp16 or bf16 (default "
                        "fp16)")
    i.add_argument("--top", type=int, default=10, help="with --precision, how many layers to print")
    i.set_defaults(fn=_cmd_inspect)

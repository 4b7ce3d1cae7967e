"""tf2onnx's conversion of an inference function, the dynamic dims it writes renamed to Cuvil's
symbols, and the ONNX import with unsupported ops named by their Keras layers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cuvil.errors import ModelError, UnsupportedOpError, UnsupportedUse
from cuvil.frontends.tensorflow.layers import LayerNames
from cuvil.frontends.tensorflow.signature import InferenceFunction
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo

log = logging.getLogger("cuvil.frontends.tensorflow")


class _Relay(logging.Handler):
    """tf2onnx's log records, at DEBUG in Cuvil's log (its errors name the ops it could not convert,
    which the import then reports, with their layers, as one error)."""

    def emit(self, record: logging.LogRecord) -> None:
        log.debug("tf2onnx: %s", record.getMessage())


def convert_function(fn: InferenceFunction) -> Any:
    """The ONNX ModelProto tf2onnx writes for ``fn``, its dynamic input dims named as ``fn`` names them."""
    import tf2onnx

    from cuvil.frontends.tensorflow import ONNX_OPSET

    quiet = logging.getLogger("tf2onnx")
    handler, level, propagate = _Relay(), quiet.level, quiet.propagate
    quiet.addHandler(handler)
    quiet.setLevel(logging.INFO)
    quiet.propagate = False
    try:
        proto, _ = tf2onnx.convert.from_function(fn.function, input_signature=fn.specs, opset=ONNX_OPSET)
    except Exception as exc:
        raise ModelError(f"tf2onnx could not convert the model: {type(exc).__name__}: {exc}") from exc
    finally:
        quiet.removeHandler(handler)
        quiet.setLevel(level)
        quiet.propagate = propagate
    name_dims(proto, fn)
    name_outputs(proto, fn.output_names)
    return proto


def name_outputs(proto: Any, names: list[str]) -> None:
    """Rename the graph's outputs (tf2onnx's ``Identity:0`` ...) to the model's output names, in order."""
    outputs = list(proto.graph.output)
    if len(outputs) != len(names):
        raise ModelError(f"tf2onnx wrote {len(outputs)} outputs for a model with {len(names)}")
    taken = {o for n in proto.graph.node for o in n.output} | {i.name for i in proto.graph.input} | {
        t.name for t in proto.graph.initializer}
    rename = {vi.name: want for vi, want in zip(outputs, names) if vi.name != want and want not in taken}
    if not rename:
        return
    for vi in [*proto.graph.output, *proto.graph.value_info]:
        vi.name = rename.get(vi.name, vi.name)
    for n in proto.graph.node:
        for i, x in enumerate(n.input):
            n.input[i] = rename.get(x, x)
        for i, x in enumerate(n.output):
            n.output[i] = rename.get(x, x)


def name_dims(proto: Any, fn: InferenceFunction) -> None:
    """Give each dynamic input dim the symbol ``fn`` names for it, and every other declaration that
    used tf2onnx's name for the same dim (``unk__N``) the same symbol."""
    by_name = {s.name: dims for s, dims in zip(fn.specs, fn.dim_names)}
    renamed: dict[str, str] = {}
    for vi in proto.graph.input:
        dims = by_name.get(vi.name)
        if dims is None:
            continue
        shape = vi.type.tensor_type.shape
        for d, want in zip(shape.dim, dims):
            if want is None:
                continue
            if d.HasField("dim_param") and d.dim_param:
                renamed.setdefault(d.dim_param, want)
            d.dim_param = want
    if not renamed:
        return
    for vi in [*proto.graph.output, *proto.graph.value_info]:
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in renamed:
                d.dim_param = renamed[d.dim_param]


def import_onnx(proto: Any, names: LayerNames, dims: Mapping[str, SymbolInfo] | None) -> Graph:
    """The ONNX front end's graph of ``proto``; ops it cannot import are refused, each with its Keras layers."""
    import onnx.defs

    from cuvil.frontends.onnx import load_onnx

    try:
        return load_onnx(proto, symbols=dims)
    except UnsupportedOpError as exc:
        uses = []
        for u in exc.uses:
            layers = names.layers_of(u.nodes)
            if u.domain in ("", "ai.onnx") and not onnx.defs.has(u.op_type):
                uses.append(UnsupportedUse(u.op_type, "tensorflow", None, u.nodes,
                                           "a TensorFlow op tf2onnx has no conversion for", layers))
            else:
                detail = u.detail or "tf2onnx converts to this ONNX op, which Cuvil does not import"
                uses.append(UnsupportedUse(u.op_type, u.domain, u.opset, u.nodes, detail, layers))
        raise UnsupportedOpError(uses) from None

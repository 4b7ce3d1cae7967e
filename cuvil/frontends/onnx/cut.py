"""A cut of a source ONNX model, made the way a cut of its imported graph was (``cuvil reduce``: what
onnxruntime runs for a candidate, and the repro's ``model.onnx``).

A cut of the imported graph (a graph of some of its nodes, the values entering it fed as inputs or
recorded constants) has inputs, outputs and recorded constants carry the
names of the source model's tensors.  :func:`extract` cuts the source model the same way: it keeps
the nodes the cut's outputs depend on, back to the cut's inputs (graph inputs), the source's
initializers and the cut's constants (initializers holding the recorded values).  A cut at a value
the source model has no tensor for (one the importer made, inside one source node's lowering) has
no ONNX form: :class:`OnnxCutError`.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import helper, numpy_helper

from cuvil.errors import CuvilError
from cuvil.frontends.onnx.attributes import to_onnx_elem
from cuvil.ir.graph import Graph


class OnnxCutError(CuvilError):
    """The cut has no ONNX form: it cuts at a value the source model has no tensor for."""


def extract(source: onnx.ModelProto, cut: Graph) -> onnx.ModelProto:
    """The part of ``source`` that ``cut`` keeps, as a model of its own with the cut's inputs and outputs."""
    g = source.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    fed = {v.name: v for v in cut.inputs}
    consts = {n.outputs[0].name: n for n in cut.nodes if n.op == "constant"}
    keep: list[onnx.NodeProto] = []
    new_inits: dict[str, onnx.TensorProto] = {}
    seen: set[str] = set()
    todo = [v.name for v in cut.outputs]
    while todo:
        name = todo.pop()
        if not name or name in seen:
            continue
        seen.add(name)
        if name in fed:
            continue
        recorded = name in consts and (consts[name].name.startswith("recorded_") or name not in producer)
        if name in inits and not recorded:
            new_inits[name] = inits[name]
        elif recorded:
            new_inits[name] = numpy_helper.from_array(consts[name].attrs["value"], name)
        elif name in producer:
            node = producer[name]
            if node not in keep:
                keep.append(node)
                todo.extend(node.input)
        else:
            raise OnnxCutError(f"the cut reads {name!r}, which the source model has no tensor for")
    order = {id(n): i for i, n in enumerate(g.node)}
    keep.sort(key=lambda n: order[id(n)])
    inputs = [helper.make_tensor_value_info(v.name, to_onnx_elem(v.type.dtype), None) for v in cut.inputs]
    outs = [helper.make_tensor_value_info(v.name, to_onnx_elem(v.type.dtype), None) for v in cut.outputs]
    graph = helper.make_graph(keep, f"{g.name}_cut", inputs, outs, list(new_inits.values()))
    model = helper.make_model(graph, opset_imports=list(source.opset_import))
    model.ir_version = source.ir_version
    return model


def load_source(path: str | Path) -> onnx.ModelProto:
    """The source model at ``path`` (the cut's source: its external data stays where it is)."""
    return onnx.load(str(path))


def save_cut(source: onnx.ModelProto, cut: Graph, path: str | Path) -> None:
    """Write :func:`extract`'s model to ``path``."""
    onnx.save(extract(source, cut), str(path))


def serialize_cut(source: onnx.ModelProto, cut: Graph) -> bytes:
    """:func:`extract`'s model as bytes (what an onnxruntime session loads)."""
    return bytes(extract(source, cut).SerializeToString())

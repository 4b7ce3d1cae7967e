"""Reading ONNX models from files, bytes or protos, with clear errors for bad input.

Everything that can be wrong with a model *before* any op is looked at is
checked here, so the importer can trust the proto's structure:

1. the source: a missing file, a folder, an unreadable or empty file;
2. the encoding: bytes that are not a protobuf, or a protobuf that is not a
   model (a TensorProto or GraphProto decodes as a ModelProto without a graph);
3. the model fields: ir_version, opset imports, a graph with outputs;
4. each graph (subgraphs included): every name defined once (ONNX graphs are
   SSA), named inputs and initializers, typed top-level inputs, element types
   that exist in ONNX;
5. external data: only files inside the model's folder, present and complete.

Every failure is a :class:`ModelError` naming the file and the offending part;
a valid feature Cuvil does not handle (sparse initializers) is an
:class:`UnsupportedOpError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from cuvil.errors import ModelError, UnsupportedOpError, UnsupportedUse

ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto

# Element-type codes ONNX defines; UNDEFINED (0) is not a type a tensor can have.
_ONNX_TYPES = frozenset(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}


def read_model(model: ModelLike) -> tuple[onnx.ModelProto, Path | None]:
    """The ModelProto (external data loaded) and the folder it came from."""
    base: Path | None = None
    if isinstance(model, onnx.ModelProto):
        proto, where = model, "model"
    elif isinstance(model, bytes):
        proto, where = _parse(model, "<bytes>"), "<bytes>"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        where = str(path)
        if not path.exists():
            raise ModelError(f"{path}: no such file")
        if path.is_dir():
            raise ModelError(f"{path}: is a folder, not an ONNX model file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"{path}: cannot read: {exc.strerror}") from None
        proto = _parse(data, where)
        base = path.resolve().parent
    else:
        raise ModelError(f"cannot read a model from {type(model).__name__}")
    _check_model(proto, where)
    _check_graph(proto.graph, where, "graph", top=True)
    _load_external(proto, base, where)
    return proto, base


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelError(f"{where}: file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelError(f"{where}: not a valid ONNX model (protobuf decoding failed: {exc})") from None
    return proto


def _check_model(proto: onnx.ModelProto, where: str) -> None:
    """A protobuf that decodes is not necessarily a model: check the fields that make one."""
    if not proto.HasField("graph"):
        raise ModelError(f"{where}: not an ONNX model (it has no graph)")
    if proto.ir_version <= 0:
        raise ModelError(f"{where}: not an ONNX model (ir_version is missing)")
    if not proto.opset_import and proto.ir_version >= 3:
        raise ModelError(f"{where}: not a valid ONNX model (no opset_import)")
    seen: dict[str, int] = {}
    for o in proto.opset_import:
        dom = _text(o.domain, where, "an opset_import domain") or "ai.onnx"
        if o.version < 1:
            raise ModelError(f"{where}: opset_import of domain {dom!r} has version {o.version}")
        if seen.get(dom, o.version) != o.version:
            raise ModelError(f"{where}: domain {dom!r} is imported twice, as opset {seen[dom]} and {o.version}")
        seen[dom] = o.version
    if not proto.graph.output:
        raise ModelError(f"{where}: the graph has no outputs")


def _check_graph(g: onnx.GraphProto, where: str, path: str, *, top: bool) -> None:
    """Structure of one graph and, recursively, of its subgraphs (``path`` names it in messages)."""
    if g.sparse_initializer:
        names = tuple(t.values.name or t.indices.name or "?" for t in g.sparse_initializer)
        raise UnsupportedOpError([UnsupportedUse("sparse_initializer", "", None, names, "sparse tensors are not supported")])
    defined: dict[str, str] = {}

    def define(name: str, by: str) -> None:
        if name in defined:
            raise ModelError(
                f"{where}: {path}: {name!r} is defined twice, by {defined[name]} and by {by} "
                "(ONNX graphs define each name once)"
            )
        defined[name] = by

    for i, t in enumerate(g.initializer):
        if not _text(t.name, where, f"{path}: the name of initializer {i}"):
            raise ModelError(f"{where}: {path}: initializer {i} has no name")
        _check_elem(t.data_type, where, f"{path}: initializer {t.name!r}")
        define(t.name, f"initializer {t.name!r}")
    inits = set(defined)
    for i, vi in enumerate(g.input):
        if not _text(vi.name, where, f"{path}: the name of input {i}"):
            raise ModelError(f"{where}: {path}: input {i} has no name")
        if vi.name in inits:
            continue  # old models (IR < 4) list every initializer among the inputs too
        define(vi.name, "a graph input")
        which = vi.type.WhichOneof("value")
        if which is None and top:
            raise ModelError(f"{where}: {path}: input {vi.name!r} has no type")
        if which == "tensor_type" and (top or vi.type.tensor_type.elem_type):
            _check_elem(vi.type.tensor_type.elem_type, where, f"{path}: input {vi.name!r}")
    for i, node in enumerate(g.node):
        _text(node.name, where, f"{path}: the name of node {i}")
        _text(node.op_type, where, f"{path}: the op_type of node {i}")
        label = f"node {node.name!r}" if node.name else f"node {i} ({node.op_type})"
        if not node.op_type:
            raise ModelError(f"{where}: {path}: {label} has no op_type")
        _text(node.domain, where, f"{path}: the domain of {label}")
        for k, name in enumerate(node.input):
            _text(name, where, f"{path}: input {k} of {label}")
        for k, out in enumerate(node.output):
            if _text(out, where, f"{path}: output {k} of {label}"):  # an empty name is an omitted optional output
                define(out, label)
        for a in node.attribute:
            _text(a.name, where, f"{path}: an attribute name of {label}")
            for sub_path, sub in _subgraphs(a, f"{path}/{label}/{a.name}"):
                _check_graph(sub, where, sub_path, top=False)
            for t in _attr_tensors(a):
                _check_elem(t.data_type, where, f"{path}: {label} attribute {a.name!r}")
    for i, vi in enumerate(g.output):
        if not _text(vi.name, where, f"{path}: the name of output {i}"):
            raise ModelError(f"{where}: {path}: output {i} has no name")
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
            for axis, d in enumerate(vi.type.tensor_type.shape.dim):
                if d.WhichOneof("value") == "dim_param":
                    _text(d.dim_param, where, f"{path}: the name of dim {axis} of {vi.name!r}")


def _text(value: object, where: str, what: str) -> str:
    """A string field of the proto; protobuf returns bytes where the file's text is not UTF-8."""
    if not isinstance(value, str):
        raise ModelError(f"{where}: {what} is not valid UTF-8 text ({value!r:.60})")
    return value


def _subgraphs(a: onnx.AttributeProto, path: str) -> Iterator[tuple[str, onnx.GraphProto]]:
    if a.type == onnx.AttributeProto.GRAPH:
        yield path, a.g
    elif a.type == onnx.AttributeProto.GRAPHS:
        for k, sub in enumerate(a.graphs):
            yield f"{path}[{k}]", sub


def _attr_tensors(a: onnx.AttributeProto) -> Iterator[onnx.TensorProto]:
    if a.type == onnx.AttributeProto.TENSOR:
        yield a.t
    elif a.type == onnx.AttributeProto.TENSORS:
        yield from a.tensors


def _check_elem(code: int, where: str, what: str) -> None:
    """An element type ONNX defines (whether Cuvil supports it is the importer's question)."""
    if code not in _ONNX_TYPES:
        name = "UNDEFINED" if code == onnx.TensorProto.UNDEFINED else str(code)
        raise ModelError(f"{where}: {what} has element type {name}, which is not an ONNX element type")


def _load_external(proto: onnx.ModelProto, base: Path | None, where: str) -> None:
    from onnx.external_data_helper import _get_all_tensors, load_external_data_for_model, uses_external_data

    tensors = [t for t in _get_all_tensors(proto) if uses_external_data(t)]
    if not tensors:
        return
    if base is None:
        raise ModelError(
            f"{where}: tensor {tensors[0].name!r} keeps its data in an external file; "
            "compile the model from its path so the file can be found"
        )
    root = base.resolve()
    for t in tensors:
        info = _external_info(t, where)
        loc = info.get("location", "")
        if "\0" in loc:  # no file name holds one (the path functions raise ValueError on it)
            raise ModelError(f"{where}: tensor {t.name!r}: external data location {loc!r} holds a NUL byte")
        target = (root / loc).resolve()
        if not loc or os.path.isabs(loc) or root not in target.parents:
            raise ModelError(f"{where}: tensor {t.name!r}: external data location {loc!r} is outside the model's folder")
        if not target.is_file():
            raise ModelError(f"{where}: tensor {t.name!r}: external data file {loc!r} not found next to the model")
        _check_extent(t, info, target, where)
    try:
        load_external_data_for_model(proto, str(root))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{where}: cannot load external data: {exc}") from None


# The keys ONNX defines for TensorProto.external_data.
_EXTERNAL_KEYS = frozenset({"location", "offset", "length", "checksum", "basepath"})


def _external_info(t: onnx.TensorProto, where: str) -> dict[str, str]:
    """A tensor's external-data entries, refusing any key onnx would silently ignore.

    A damaged key (``offset`` with a flipped byte) must not quietly become
    "read from byte 0"; protobuf hands back bytes for text that is not UTF-8."""
    info: dict[str, str] = {}
    for e in t.external_data:
        key, value = e.key, e.value
        if not isinstance(key, str) or not isinstance(value, str):
            raise ModelError(f"{where}: tensor {t.name!r}: external data entry {key!r} is not valid text")
        if key not in _EXTERNAL_KEYS:
            raise ModelError(
                f"{where}: tensor {t.name!r}: unknown external data key {key!r} "
                f"(ONNX defines {', '.join(sorted(_EXTERNAL_KEYS))})"
            )
        info[key] = value
    return info


def _check_extent(t: onnx.TensorProto, info: dict[str, str], target: Path, where: str) -> None:
    """The offset and length a tensor names lie inside its file (onnx would read a short tensor silently)."""
    what = f"{where}: tensor {t.name!r}: external data"
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelError(f"{what} has a malformed offset or length ({info})") from None
    size = target.stat().st_size
    if offset < 0 or (length is not None and length < 0):
        raise ModelError(f"{what} has a negative offset or length ({info})")
    end = offset + (length if length is not None else 0)
    if offset > size or end > size:
        raise ModelError(
            f"{what} {info.get('location')!r} is {size} bytes, but the tensor reads bytes {offset} to {end}"
        )

"""Reading ONNX models from files, bytes or protos, with clear errors for bad input."""

from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from cuvil.errors import ModelError

ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto


def read_model(model: ModelLike) -> tuple[onnx.ModelProto, Path | None]:
    """The ModelProto (external data loaded) and the folder it came from."""
    base: Path | None = None
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = _parse(model, "<bytes>")
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise ModelError(f"{path}: no such file")
        if path.is_dir():
            raise ModelError(f"{path}: is a folder, not an ONNX model file")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelError(f"{path}: cannot read: {exc.strerror}") from None
        proto = _parse(data, str(path))
        base = path.resolve().parent
    else:
        raise ModelError(f"cannot read a model from {type(model).__name__}")
    _check_shape(proto, str(model) if not isinstance(model, (bytes, onnx.ModelProto)) else "model")
    if base is not None:
        _load_external(proto, base)
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


def _check_shape(proto: onnx.ModelProto, where: str) -> None:
    """A protobuf that decodes is not necessarily a model: check the fields that make one."""
    if not proto.HasField("graph"):
        raise ModelError(f"{where}: not an ONNX model (it has no graph)")
    if proto.ir_version <= 0:
        raise ModelError(f"{where}: not an ONNX model (ir_version is missing)")
    if not proto.opset_import and proto.ir_version >= 3:
        raise ModelError(f"{where}: not a valid ONNX model (no opset_import)")
    if not proto.graph.output:
        raise ModelError(f"{where}: the graph has no outputs")


def _load_external(proto: onnx.ModelProto, base: Path) -> None:
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    tensors = [t for t in onnx.external_data_helper._get_all_tensors(proto) if uses_external_data(t)]
    if not tensors:
        return
    root = base.resolve()
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "")
        target = (root / loc).resolve()
        if not loc or os.path.isabs(loc) or root not in target.parents:
            raise ModelError(f"tensor {t.name!r}: external data location {loc!r} is outside the model's folder")
        if not target.is_file():
            raise ModelError(f"tensor {t.name!r}: external data file {loc!r} not found next to the model")
    try:
        load_external_data_for_model(proto, str(root))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load external data: {exc}") from None

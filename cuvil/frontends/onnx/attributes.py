"""ONNX element types and attributes as Cuvil reads them: the dtype of each TensorProto element
type, tensors as NumPy arrays, attribute values, and the check that an attribute has the type its
op's schema declares."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from cuvil.errors import ModelError, UnsupportedOpError, UnsupportedUse
from cuvil.ir.dtypes import DType

ONNX_DOMAINS = ("", "ai.onnx")

# ONNX TensorProto element types Cuvil supports.
_ELEM: dict[int, DType] = {
    onnx.TensorProto.DOUBLE: DType.f64,
    onnx.TensorProto.FLOAT: DType.f32,
    onnx.TensorProto.FLOAT16: DType.f16,
    onnx.TensorProto.BFLOAT16: DType.bf16,
    onnx.TensorProto.INT64: DType.i64,
    onnx.TensorProto.INT32: DType.i32,
    onnx.TensorProto.INT16: DType.i16,
    onnx.TensorProto.INT8: DType.i8,
    onnx.TensorProto.UINT8: DType.u8,
    onnx.TensorProto.UINT16: DType.u16,
    onnx.TensorProto.UINT32: DType.u32,
    onnx.TensorProto.UINT64: DType.u64,
    onnx.TensorProto.BOOL: DType.bool,
    # the low-bit storage types (cuvil/ir/dtypes.py): quantize/dequantize, cast and data movement only
    onnx.TensorProto.INT4: DType.i4,
    onnx.TensorProto.UINT4: DType.u4,
    onnx.TensorProto.INT2: DType.i2,
    onnx.TensorProto.UINT2: DType.u2,
    onnx.TensorProto.FLOAT8E4M3FN: DType.f8e4m3fn,
    onnx.TensorProto.FLOAT8E4M3FNUZ: DType.f8e4m3fnuz,
    onnx.TensorProto.FLOAT8E5M2: DType.f8e5m2,
    onnx.TensorProto.FLOAT8E5M2FNUZ: DType.f8e5m2fnuz,
    onnx.TensorProto.FLOAT4E2M1: DType.f4e2m1,
}


def dtype_of(elem_type: int, what: str) -> DType:
    """The Cuvil dtype of an ONNX element type, or a clear error."""
    try:
        return _ELEM[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else str(elem_type)
        raise UnsupportedOpError([UnsupportedUse(f"tensor type {name}", "", None, (what,), "element type not supported")]) from None


def known_dtype(elem_type: int) -> DType | None:
    """The Cuvil dtype of an ONNX element type, or None for one Cuvil does not support."""
    return _ELEM.get(elem_type)


def to_onnx_elem(dtype: DType) -> int:
    for k, v in _ELEM.items():
        if v is dtype:
            return k
    raise KeyError(dtype)


def attr_value(a: onnx.AttributeProto) -> Any:
    at = onnx.AttributeProto
    if a.type == at.FLOAT:
        return float(a.f)
    if a.type == at.INT:
        return int(a.i)
    if a.type == at.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == at.TENSOR:
        return tensor_to_array(a.t, a.name)
    if a.type == at.GRAPH:
        return a.g
    if a.type == at.FLOATS:
        return [float(x) for x in a.floats]
    if a.type == at.INTS:
        return [int(x) for x in a.ints]
    if a.type == at.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == at.TENSORS:
        return [tensor_to_array(t, a.name) for t in a.tensors]
    if a.type == at.SPARSE_TENSOR:
        raise ModelError(f"attribute {a.name!r}: sparse tensors are not supported")
    raise ModelError(f"attribute {a.name!r} has an unsupported type {at.AttributeType.Name(a.type)}")


@functools.cache
def _schema_attr_types(domain: str, op_type: str, opset: int) -> dict[str, int] | None:
    """The attribute types the ONNX schema of ``op_type`` (at ``opset``) declares; None without a schema."""
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    # (the schema's AttrType numbers are AttributeProto's)
    return {name: int(a.type.value) for name, a in schema.attributes.items()}  # type: ignore[attr-defined]


def check_attribute_types(node: onnx.NodeProto, name: str, opset: int) -> None:
    """Refuse an attribute whose type is not the one the op's ONNX schema declares (a FLOAT ``axis``).

    The importers read attributes by the schema's types; checked once here, for every op of the
    ONNX domain, rather than in each importer (custom domains have no ONNX schema)."""
    if node.domain not in ONNX_DOMAINS:
        return
    declared = _schema_attr_types("", node.op_type, opset)
    if declared is None:
        return
    at = onnx.AttributeProto.AttributeType
    for a in node.attribute:
        want = declared.get(a.name)
        if want is not None and a.type != at.UNDEFINED and a.type != want:
            raise ModelError(f"node {name!r} ({node.op_type}): attribute {a.name!r} is {at.Name(a.type)}, "
                             f"the op declares it {at.Name(want)}")


def tensor_to_array(t: onnx.TensorProto, what: str) -> np.ndarray:
    dtype_of(t.data_type, f"tensor {t.name or what!r}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as exc:
        raise ModelError(f"tensor {t.name or what!r} is malformed: {exc}") from None
    expected = _ELEM[t.data_type].np
    if arr.dtype != expected:
        arr = arr.astype(expected)
    return np.asarray(arr, order="C")  # not ascontiguousarray: it turns a scalar into shape [1]

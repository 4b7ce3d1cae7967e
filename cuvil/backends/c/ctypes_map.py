"""How each Cuvil element type is stored and computed in generated C."""

from __future__ import annotations

from cuvil.ir.dtypes import DType

# storage type, compute type, enum cuvil_dtype code
C_TYPES: dict[DType, tuple[str, str, int]] = {
    DType.f64: ("double", "double", 0),
    DType.f32: ("float", "float", 1),
    DType.f16: ("cuvil_f16", "float", 2),
    DType.bf16: ("cuvil_bf16", "float", 3),
    DType.i64: ("int64_t", "int64_t", 4),
    DType.i32: ("int32_t", "int32_t", 5),
    DType.i16: ("int16_t", "int32_t", 6),
    DType.i8: ("int8_t", "int32_t", 7),
    DType.u8: ("uint8_t", "uint32_t", 8),
    DType.u16: ("uint16_t", "uint32_t", 9),
    DType.u32: ("uint32_t", "uint32_t", 10),
    DType.u64: ("uint64_t", "uint64_t", 11),
    DType.bool: ("cuvil_bool", "int", 12),
    # low-bit storage types: one element a byte, its value in the low bits as ml_dtypes keeps it
    # (cuvil_lowbit.h reads and writes them; any higher bits are ignored on reading)
    DType.i4: ("uint8_t", "int32_t", 13),
    DType.u4: ("uint8_t", "uint32_t", 14),
    DType.i2: ("uint8_t", "int32_t", 15),
    DType.u2: ("uint8_t", "uint32_t", 16),
    DType.f8e4m3fn: ("uint8_t", "float", 17),
    DType.f8e4m3fnuz: ("uint8_t", "float", 18),
    DType.f8e5m2: ("uint8_t", "float", 19),
    DType.f8e5m2fnuz: ("uint8_t", "float", 20),
    DType.f4e2m1: ("uint8_t", "float", 21),
}
LOWBIT_HEADER = "cuvil_lowbit.h"


def storage(dt: DType) -> str:
    return C_TYPES[dt][0]


def compute(dt: DType) -> str:
    return C_TYPES[dt][1]


def code(dt: DType) -> int:
    return C_TYPES[dt][2]


def load(dt: DType, ptr: str, index: str) -> str:
    """A C expression reading element ``index`` of ``ptr`` in the compute type."""
    if dt is DType.f16:
        return f"cuvil_f16_to_f32({ptr}[{index}])"
    if dt is DType.bf16:
        return f"cuvil_bf16_to_f32({ptr}[{index}])"
    if dt is DType.bool:
        return f"((int){ptr}[{index}])"
    if dt.is_lowbit:  # cuvil_lowbit.h
        return f"cuvil_from_{dt.value}({ptr}[{index}])"
    return f"{ptr}[{index}]"


def convert(dt: DType, expr: str) -> str:
    """``expr`` (in ``dt``'s compute type) converted to ``dt``'s storage type."""
    if dt is DType.f16:
        return f"cuvil_f32_to_f16({expr})"
    if dt is DType.bf16:
        return f"cuvil_f32_to_bf16({expr})"
    if dt is DType.bool:
        return f"(cuvil_bool)(({expr}) != 0)"
    if dt.is_lowbit:  # float8 saturating (ONNX's default); integers keep their low bits (cuvil_lowbit.h)
        return f"cuvil_to_{dt.value}({expr}, 1)" if compute(dt) == "float" else f"cuvil_to_{dt.value}((uint32_t)({expr}))"
    return f"({storage(dt)})({expr})"


def store(dt: DType, ptr: str, index: str, expr: str) -> str:
    """A C statement writing ``expr`` (in the compute type) to element ``index``."""
    return f"{ptr}[{index}] = {convert(dt, expr)};"

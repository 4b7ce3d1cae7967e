"""Element types of Cuvil tensors and their NumPy counterparts.

The low-bit types (:data:`LOWBIT`: 4- and 2-bit integers, the float8 and float4 formats) are
storage types: one element a byte, held in NumPy by ml_dtypes (the value in the low bits of
the byte, as ml_dtypes keeps it).  Only the ops with the ``storage_types`` trait
(``cuvil/ops/registry.py``: quantize/dequantize, cast, and data movement that never reads values)
take them; they are in none of :data:`FLOATS`, :data:`INTS`, :data:`NUMERIC` or :data:`ALL`, and
``is_float`` / ``is_int`` are false for them, so no check written for the computable types
admits them by accident.
"""

from __future__ import annotations

import builtins
import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    """A tensor element type. The value is the short name used in the text IR."""

    f64 = "f64"
    f32 = "f32"
    f16 = "f16"
    bf16 = "bf16"
    i64 = "i64"
    i32 = "i32"
    i16 = "i16"
    i8 = "i8"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    bool = "bool"
    i4 = "i4"
    u4 = "u4"
    i2 = "i2"
    u2 = "u2"
    f8e4m3fn = "f8e4m3fn"
    f8e4m3fnuz = "f8e4m3fnuz"
    f8e5m2 = "f8e5m2"
    f8e5m2fnuz = "f8e5m2fnuz"
    f4e2m1 = "f4e2m1"

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype that holds this element type."""
        return _TO_NP[self]

    @property
    def itemsize(self) -> int:
        return int(_TO_NP[self].itemsize)

    @property
    def is_float(self) -> builtins.bool:
        return self in FLOATS

    @property
    def is_int(self) -> builtins.bool:
        return self in INTS

    @property
    def holds_floats(self) -> builtins.bool:
        """Whether its values are floating point: :data:`FLOATS` or the low-bit float types."""
        return self in FLOATS or self in LOWBIT_FLOATS

    @property
    def is_lowbit(self) -> builtins.bool:
        """Whether this is a low-bit storage type (:data:`LOWBIT`)."""
        return self in LOWBIT

    @property
    def is_signed(self) -> builtins.bool:
        return self in FLOATS or self in SIGNED_INTS

    @staticmethod
    def from_np(dtype: object) -> DType:
        """The DType of a NumPy dtype; raises ``TypeError`` for one Cuvil lacks."""
        d = np.dtype(dtype)  # type: ignore[call-overload]
        try:
            return _FROM_NP[d]
        except KeyError:
            raise TypeError(f"unsupported element type {d}") from None

    @staticmethod
    def parse(name: str) -> DType:
        try:
            return DType(name)
        except ValueError:
            raise ValueError(f"unknown element type {name!r}") from None

    def __str__(self) -> str:
        return self.value


_TO_NP: dict[DType, np.dtype] = {
    DType.f64: np.dtype(np.float64),
    DType.f32: np.dtype(np.float32),
    DType.f16: np.dtype(np.float16),
    DType.bf16: np.dtype(ml_dtypes.bfloat16),
    DType.i64: np.dtype(np.int64),
    DType.i32: np.dtype(np.int32),
    DType.i16: np.dtype(np.int16),
    DType.i8: np.dtype(np.int8),
    DType.u8: np.dtype(np.uint8),
    DType.u16: np.dtype(np.uint16),
    DType.u32: np.dtype(np.uint32),
    DType.u64: np.dtype(np.uint64),
    DType.bool: np.dtype(np.bool_),
    DType.i4: np.dtype(ml_dtypes.int4),
    DType.u4: np.dtype(ml_dtypes.uint4),
    DType.i2: np.dtype(ml_dtypes.int2),
    DType.u2: np.dtype(ml_dtypes.uint2),
    DType.f8e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.f8e4m3fnuz: np.dtype(ml_dtypes.float8_e4m3fnuz),
    DType.f8e5m2: np.dtype(ml_dtypes.float8_e5m2),
    DType.f8e5m2fnuz: np.dtype(ml_dtypes.float8_e5m2fnuz),
    DType.f4e2m1: np.dtype(ml_dtypes.float4_e2m1fn),
}
_FROM_NP: dict[np.dtype, DType] = {v: k for k, v in _TO_NP.items()}

FLOATS = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16})
SIGNED_INTS = frozenset({DType.i64, DType.i32, DType.i16, DType.i8})
UNSIGNED_INTS = frozenset({DType.u8, DType.u16, DType.u32, DType.u64})
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS | INTS
ALL = NUMERIC | {DType.bool}  # every type ops compute on; the low-bit storage types are not in it
LOWBIT_INTS = frozenset({DType.i4, DType.u4, DType.i2, DType.u2})
FLOAT8S = frozenset({DType.f8e4m3fn, DType.f8e4m3fnuz, DType.f8e5m2, DType.f8e5m2fnuz})
LOWBIT_FLOATS = FLOAT8S | {DType.f4e2m1}
LOWBIT = LOWBIT_INTS | LOWBIT_FLOATS


def int_bounds(dt: DType) -> tuple[int, int]:
    """The smallest and largest value of an integer type, the low-bit ones included."""
    info = ml_dtypes.iinfo(dt.np)  # type: ignore[no-untyped-call]
    return int(info.min), int(info.max)


def max_finite(dt: DType) -> float:
    """The largest finite value of a float type, bfloat16 and the low-bit ones included."""
    return float(ml_dtypes.finfo(dt.np).max)  # type: ignore[no-untyped-call]


LOWBIT_INT_RANGES: dict[DType, tuple[int, int]] = {d: int_bounds(d) for d in LOWBIT_INTS}


def is_float_np(dtype: object) -> builtins.bool:
    """Whether a NumPy dtype is a float type, bfloat16 included.

    ``dtype.kind == "f"`` is not this test: ml_dtypes' bfloat16 has kind ``"V"``."""
    d = np.dtype(dtype)  # type: ignore[call-overload]
    return d.kind == "f" or builtins.bool(d == _TO_NP[DType.bf16])

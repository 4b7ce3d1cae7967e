"""Element types of Cuvil tensors and their NumPy counterparts."""

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
}
_FROM_NP: dict[np.dtype, DType] = {v: k for k, v in _TO_NP.items()}

FLOATS = frozenset({DType.f64, DType.f32, DType.f16, DType.bf16})
SIGNED_INTS = frozenset({DType.i64, DType.i32, DType.i16, DType.i8})
UNSIGNED_INTS = frozenset({DType.u8, DType.u16, DType.u32, DType.u64})
INTS = SIGNED_INTS | UNSIGNED_INTS
NUMERIC = FLOATS | INTS
ALL = NUMERIC | {DType.bool}


def is_float_np(dtype: object) -> builtins.bool:
    """Whether a NumPy dtype is a float type, bfloat16 included.

    ``dtype.kind == "f"`` is not this test: ml_dtypes' bfloat16 has kind ``"V"``."""
    d = np.dtype(dtype)  # type: ignore[call-overload]
    return d.kind == "f" or builtins.bool(d == _TO_NP[DType.bf16])

"""Conversions to and from the low-bit storage types: the one NumPy definition.

``cast`` (``cuvil/ops/cast.py``) and ``quantize_linear`` / ``dequantize_linear``
(``cuvil/ops/quant.py``) convert with these functions; the C backend's
``cuvil_lowbit.h`` implements the same rules bit for bit.  The rules are ONNX's,
with the cases ONNX leaves open defined:

1. Into a float8 type (f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz): the value is
   first a float32 (float64 rounds to float32 first, as ml_dtypes converts;
   integers convert to float32), then rounded to nearest even.  With
   ``saturate`` (the default) a result beyond the largest finite value, and an
   infinity, give the largest finite value of that sign.  Without it they give
   infinity (f8e5m2) or NaN (the others: they have no infinity).  NaN gives
   NaN (sign kept where the type has signed NaNs: ``S.1111.111`` for e4m3fn,
   ``S.11111.10`` for e5m2; ``0x80`` for the fnuz types).  The fnuz types have
   no negative zero: a result that rounds to zero is ``+0``.
2. Into f4e2m1 (no infinity, no NaN): as 1, always saturating; NaN gives +0.
   (ONNX's float4 note says 6, its reference and conformance data give a zero;
   Cuvil follows the data.)
3. Into a 4- or 2-bit integer: an integer keeps its low bits (two's complement
   wrap-around, as every integer-to-integer cast); a float truncates toward
   zero and then keeps the low bits, and NaN, infinities and magnitudes of
   2**31 or more give 0 (ONNX leaves those undefined; this is what its
   reference gives).  Bool gives 0 or 1.
4. Out of a low-bit type: the value is exact in float32 (floats) or int64
   (integers), and converts from there by the ordinary rules (``cuvil/ops/cast.py``).
5. Quantization to a 4- or 2-bit integer saturates to its range like the 8-
   and 16-bit types (:data:`LOWBIT_INT_RANGES`); to a float type it is rule 1
   or 2 of ``X / scale`` (the zero point must be zero: :func:`check_zero_point`).
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import LOWBIT_INT_RANGES, LOWBIT_INTS, DType, max_finite

__all__ = ["LOWBIT_INT_RANGES", "check_zero_point", "from_lowbit", "to_lowbit_float", "to_lowbit_int"]
_BITS = {DType.i4: 4, DType.u4: 4, DType.i2: 2, DType.u2: 2}


def to_lowbit_float(x: np.ndarray, dt: DType, saturate: bool = True) -> np.ndarray:
    """``x`` (any element type) as the low-bit float type ``dt`` (rules 1 and 2)."""
    with np.errstate(all="ignore"):
        f = np.asarray(x).astype(np.float32)
        if saturate or dt is DType.f4e2m1:
            m = np.float32(max_finite(dt))
            f = np.clip(f, -m, m)  # NaN stays NaN
        y = np.asarray(f.astype(dt.np))
    if dt is DType.f4e2m1:
        y[np.isnan(f)] = 0
    return y


def to_lowbit_int(x: np.ndarray, dt: DType) -> np.ndarray:
    """``x`` (any element type) as the 4- or 2-bit integer type ``dt`` (rule 3)."""
    a = np.asarray(x)
    src = DType.from_np(a.dtype)
    if src.holds_floats:
        with np.errstate(all="ignore"):
            f = a.astype(np.float64)
            ok = np.abs(f) < 2.0**31  # False for NaN and infinities
            v = np.where(ok, np.trunc(np.where(ok, f, 0.0)), 0.0).astype(np.int64)
    else:
        v = a.astype(np.int64)
    bits = _BITS[dt]
    low = v & ((1 << bits) - 1)
    if dt in (DType.i4, DType.i2):
        low = np.where(low >= 1 << (bits - 1), low - (1 << bits), low)
    return np.asarray(low).astype(dt.np)


def from_lowbit(x: np.ndarray) -> np.ndarray:
    """A low-bit array as the type that holds its values exactly (rule 4): float32 or int64."""
    dt = DType.from_np(x.dtype)
    return x.astype(np.int64 if dt in LOWBIT_INTS else np.float32)


def check_zero_point(zp: np.ndarray, dt: DType) -> str | None:
    """Why ``zp`` cannot be the zero point of a quantization to the low-bit float type ``dt`` (None when it
    can: every element is zero, of either sign).  ONNX requires zero for float8; float4 follows it."""
    f = np.asarray(zp).astype(np.float32)
    if np.all(f == 0):
        return None
    bad = f[f != 0].reshape(-1)[0]  # NaN compares unequal, so it is refused too
    return f"the zero point of a {dt} quantization must be 0, got {bad}"

"""``cast``: conversion between element types.

The rules are ONNX's:

* float to float rounds to nearest even; out of range gives +-inf;
* float to integer truncates toward zero; NaN, infinities and out-of-range
  values are undefined in ONNX (the reference gives NumPy's result);
* integer to integer keeps the low bits (two's complement wrap-around);
* anything to bool is ``x != 0`` (NaN is true); bool to a number is 0 or 1;
* to and from the low-bit storage types (int4, float8 ...): ``cuvil/ops/lowbit.py``;
  ``saturate`` (default 1) chooses what a float8 result beyond the type's range
  becomes (its largest finite value, or infinity / NaN), and changes nothing else.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import ALL, LOWBIT, LOWBIT_FLOATS, LOWBIT_INTS, DType
from cuvil.ir.types import TensorType
from cuvil.ops.lowbit import from_lowbit, to_lowbit_float, to_lowbit_int
from cuvil.ops.registry import ELEMENTWISE, STORAGE_TYPES, AttrSpec, InferCtx, OpDef, RefCtx, register


def _cast_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, ALL | LOWBIT)
    to = ctx.attrs["to"]
    if not isinstance(to, DType):
        raise ctx.fail(f"attribute 'to' must be an element type, got {to!r}")
    if ctx.attrs["saturate"] not in (0, 1):
        raise ctx.fail(f"saturate must be 0 or 1, got {ctx.attrs['saturate']!r}")
    return [TensorType(to, ctx.type(0).shape)]


def cast_array(x: np.ndarray, to: DType, saturate: bool = True) -> np.ndarray:
    """``x`` converted to ``to`` by the rules of this module."""
    if to in LOWBIT_FLOATS:
        return to_lowbit_float(x, to, saturate)
    if to in LOWBIT_INTS:
        return to_lowbit_int(x, to)
    if DType.from_np(x.dtype) in LOWBIT:
        x = from_lowbit(x)
    with np.errstate(all="ignore"):
        return x.astype(to.np)


def _cast_ref(ctx: RefCtx) -> list[np.ndarray]:
    return [cast_array(ctx.input(0), ctx.attrs["to"], bool(ctx.attrs["saturate"]))]


register(
    OpDef(
        name="cast",
        inputs=("X",),
        attrs={"to": AttrSpec("dtype"), "saturate": AttrSpec("int", 1)},
        infer=_cast_infer,
        reference=_cast_ref,
        traits=frozenset({STORAGE_TYPES, ELEMENTWISE}),
        doc="X converted to the element type `to`.",
    )
)

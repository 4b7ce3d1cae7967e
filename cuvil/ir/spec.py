"""TensorSpec: the declared type of one model input or output, as users write it and as a compiled
model's signature records it.

It sits beside the IR's types rather than in the runtime: front ends build specs from example
inputs, passes' instruments and sample-input generation read them, and the runtime's signature
holds them, so every one of those layers can import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, DimExpr, format_dim, parse_dim
from cuvil.ir.types import TensorType


class TensorSpec:
    """The declared type of one model input or output.

    Users describe an input by shape and element type, with names for symbolic
    dims: ``TensorSpec(("batch", 3, "32*h", 224), "float32", name="image")``
    (constraints on ``batch`` and ``h`` go in ``cuvil.compile(..., dims=)``).
    Cuvil itself builds specs from a value's name and type: ``TensorSpec(name, TensorType)``.
    """

    def __init__(self, shape: Sequence[int | str | DimExpr] | str, dtype: Any = None, name: str | None = None) -> None:
        if isinstance(shape, str) and isinstance(dtype, TensorType) and name is None:
            self.name, self.type = shape, dtype
            return
        if isinstance(shape, str) or not isinstance(shape, Sequence):
            raise TypeError(f"TensorSpec: shape must be a sequence of ints and dim names, got {shape!r}")
        dims = tuple(_spec_dim(d) for d in shape)
        self.name = name or ""
        self.type = TensorType(_spec_dtype("float32" if dtype is None else dtype), dims)

    @property
    def dtype(self) -> str:
        return str(self.type.dtype)

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.type.shape

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": str(self.type.dtype), "shape": [format_dim(d) for d in self.type.shape]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorSpec:
        shape = tuple(parse_dim(str(x)) for x in d["shape"])
        return TensorSpec(str(d["name"]), TensorType(DType.parse(str(d["dtype"])), shape))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorSpec) and (self.name, self.type) == (other.name, other.type)

    def __hash__(self) -> int:
        return hash((self.name, self.type))

    def __repr__(self) -> str:
        return f"TensorSpec({self.name!r}, {self.type})"


def _spec_dim(d: object) -> Dim:
    if isinstance(d, bool):
        raise TypeError(f"TensorSpec: {d!r} is not a dim")
    if isinstance(d, int | DimExpr):
        if isinstance(d, int) and d < 0:
            raise TypeError(f"TensorSpec: dim {d} is negative")
        return d
    if isinstance(d, str):
        parsed = parse_dim(d)
        if isinstance(parsed, DimExpr) and parsed.is_unknown:
            raise TypeError(f"TensorSpec: dim {d!r} must be an int or a symbol expression such as 'batch' or '32*h'")
        return parsed
    raise TypeError(f"TensorSpec: dim {d!r} must be an int, a symbol name or an expression such as '32*h'")


def _spec_dtype(d: object) -> DType:
    """An element type given as a DType, a name ("float32", "f32"), a NumPy dtype or a torch dtype."""
    if isinstance(d, DType):
        return d
    text = str(d)
    if text.startswith("torch."):
        d = text = text.removeprefix("torch.")  # torch.float32 -> "float32", without importing torch
    if text == "bfloat16":
        return DType.bf16
    try:
        return DType.parse(text)
    except ValueError:
        pass
    try:
        return DType.from_np(np.dtype(d))  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"TensorSpec: unknown element type {d!r}") from None


def parse_spec(text: str) -> TensorSpec:
    """An input's spec as the command line writes it: ``SHAPE[:DTYPE]``, the dims separated by commas
    (ints, symbol names or expressions such as ``32*h``; none for a scalar), then an element type
    (default float32): ``1,3,224,224``, ``batch,3,32*h,32*w``, ``batch,128:int64``.  Malformed text is
    a CuvilError naming it."""
    shape_text, _, dtype = text.strip().partition(":")
    dims = [d.strip() for d in shape_text.split(",")] if shape_text.strip() else []
    try:
        if any(not d for d in dims):
            raise ValueError("a dim is empty")
        shape = [int(d) if d.lstrip("-").isdigit() else d for d in dims]
        return TensorSpec(shape, dtype.strip() or "float32")
    except (TypeError, ValueError) as exc:
        raise CuvilError(f"input spec {text!r}: {exc} (expected SHAPE[:DTYPE], e.g. 1,3,224,224 or "
                         "batch,128:int64)") from None

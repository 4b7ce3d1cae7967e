"""Tensor types (element type and shape) and symbol constraints."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, evaluate, format_dim, free_symbols


@dataclass(frozen=True)
class TensorType:
    """A tensor's element type and shape; each dim is an int or a DimExpr."""

    dtype: DType
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for d in self.shape:
            out |= free_symbols(d)
        return out

    def concrete_shape(self, env: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, env) for d in self.shape)

    def with_shape(self, shape: Sequence[Dim]) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(format_dim(d) for d in self.shape)}]"


@dataclass(frozen=True)
class SymbolInfo:
    """A named dim and the constraints every value of it must satisfy."""

    name: str
    min: int | None = None
    max: int | None = None
    multiple_of: int | None = None

    def check(self, value: int) -> str | None:
        """None when ``value`` is allowed, else a sentence saying why not."""
        if self.min is not None and value < self.min:
            return f"{self.name}={value} is below its minimum {self.min}"
        if self.max is not None and value > self.max:
            return f"{self.name}={value} is above its maximum {self.max}"
        if self.multiple_of is not None and value % self.multiple_of != 0:
            return f"{self.name}={value} is not a multiple of {self.multiple_of}"
        return None

    @property
    def is_constrained(self) -> bool:
        return self.min is not None or self.max is not None or self.multiple_of is not None

    def describe(self) -> str:
        parts = []
        if self.min is not None or self.max is not None:
            lo = "" if self.min is None else str(self.min)
            hi = "" if self.max is None else str(self.max)
            parts.append(f"{lo}..{hi}")
        if self.multiple_of is not None:
            parts.append(f"%{self.multiple_of}")
        return " ".join(parts)

"""What a custom op declares (:class:`Arg`, :class:`OpSchema`), the error its checks raise, and
how their messages show shapes, element types and arguments."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import Dim, format_dim
from cuvil.ops.registry import REQUIRED

NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Namespaces whose ops belong to a front end's standard op set or to Cuvil itself.
RESERVED_NAMESPACES = frozenset({"ai.onnx", "ai.onnx.ml", "aten", "prim", "prims", "cuvil"})
MAX_RANK = 8


class CustomOpError(CuvilError):
    """A custom op's declaration, reference, C kernel or backward disagree; ``kind`` names the check."""

    def __init__(self, op: str, kind: str, message: str) -> None:
        self.op, self.kind = op, kind
        super().__init__(f"register_op({op!r}): {kind} mismatch: {message}")


@dataclass(frozen=True)
class Arg:
    """One tensor input or output: its name, rank (None: any) and allowed element types."""

    name: str
    rank: int | None = None
    dtypes: Sequence[DType | str] = ("f32",)

    def allowed(self) -> tuple[DType, ...]:
        return tuple(d if isinstance(d, DType) else DType.parse(str(d)) for d in self.dtypes)


@dataclass(frozen=True)
class OpSchema:
    """What a custom op takes and gives.

    ``shape(*input_shapes, **attrs)`` returns one shape per output; shapes are tuples of
    dims (ints, or symbolic dims: use ``+ - * //``, never ``int()`` or comparisons).
    ``dtype(*input_dtypes, **attrs)`` returns one DType per output; without it each output
    must declare exactly one dtype.  ``attrs`` maps attribute names to defaults (an int
    or float), or to the type ``int`` / ``float`` for a required one."""

    inputs: Sequence[Arg]
    outputs: Sequence[Arg]
    shape: Callable[..., Sequence[Sequence[Dim]]]
    dtype: Callable[..., Sequence[DType | str]] | None = None
    attrs: Mapping[str, int | float | type] = field(default_factory=dict)
    backward_inputs: Sequence[str] | None = None  # default: the forward inputs, then grad_<output> per output

    def attr_kinds(self) -> dict[str, tuple[str, Any]]:
        """Attribute name -> (kind, default or REQUIRED)."""
        out: dict[str, tuple[str, Any]] = {}
        for k, v in self.attrs.items():
            if v is int or v is float:
                out[k] = (v.__name__, REQUIRED)
            elif isinstance(v, bool) or not isinstance(v, int | float):
                raise TypeError(f"attribute {k!r}: give an int or float default, or the type int / float, not {v!r}")
            else:
                out[k] = ("int" if isinstance(v, int) else "float", v)
        return out

    def grad_inputs(self) -> list[str]:
        if self.backward_inputs is not None:
            return list(self.backward_inputs)
        return [a.name for a in self.inputs] + [f"grad_{o.name}" for o in self.outputs]


Sample = Sequence[np.ndarray] | Mapping[str, Any]


# formatting ---------------------------------------------------------------------------------------
def fmt_shape(shape: Sequence[Dim]) -> str:
    return f"[{', '.join(format_dim(d) for d in shape)}]"


def fmt_dtypes(dts: Sequence[DType]) -> str:
    return ", ".join(str(d) for d in dts)


def dtype_name(dt: np.dtype) -> str:
    try:
        return str(DType.from_np(dt))
    except TypeError:
        return str(dt)


def fmt_arg(a: Arg) -> str:
    rank = "any rank" if a.rank is None else f"rank {a.rank}"
    return f"{rank}, {fmt_dtypes(a.allowed())}"


def fmt_inputs(schema: OpSchema, arrays: Sequence[np.ndarray]) -> str:
    return ", ".join(f"{a.name}: {dtype_name(x.dtype)}{list(x.shape)}" for a, x in zip(schema.inputs, arrays))


def fmt_signature(fn: Callable[..., Any], sig: inspect.Signature) -> str:
    return f"{getattr(fn, '__name__', 'function')}{sig}"

"""The exceptions Cuvil raises. Every user-facing failure is a CuvilError."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class CuvilError(Exception):
    """Base of all errors Cuvil reports to its users."""


class ModelError(CuvilError):
    """The model file or object is missing, malformed or inconsistent."""


class ShapeError(CuvilError):
    """Shape or dtype inference found inputs an op cannot take."""


class StorageTypeError(ShapeError):
    """An op that computes was given a low-bit storage type (int4, float8 ...), which only
    quantize/dequantize, cast and data movement take (``cuvil/ir/dtypes.py``)."""


class IRError(CuvilError):
    """The IR is structurally invalid (the verifier's finding), or its text does not parse."""


class InputError(CuvilError):
    """A compiled model was called with inputs that break its contract."""


@dataclass(frozen=True)
class UnsupportedUse:
    """One op type outside Cuvil's support, and where the model uses it."""

    op_type: str
    domain: str
    opset: int | None
    nodes: tuple[str, ...]
    detail: str = ""
    #: the source model's layers that hold the nodes, where a front end knows them (a Keras layer path)
    layers: tuple[str, ...] = ()

    def describe(self) -> str:
        dom = self.domain or "ai.onnx"
        ver = f" (opset {self.opset})" if self.opset is not None else ""
        names = ", ".join(repr(n) for n in self.nodes[:10])
        more = f" and {len(self.nodes) - 10} more" if len(self.nodes) > 10 else ""
        why = f": {self.detail}" if self.detail else ""
        shown = ", ".join(repr(n) for n in self.layers[:10])
        where = (f" in layer{'s' if len(self.layers) > 1 else ''} {shown}"
                 f"{f' and {len(self.layers) - 10} more' if len(self.layers) > 10 else ''}" if self.layers else "")
        return f"{dom}::{self.op_type}{ver}{why}; used by {names}{more}{where}"


class UnsupportedOpError(CuvilError):
    """The model uses ops Cuvil does not support; lists every one of them."""

    def __init__(self, uses: Sequence[UnsupportedUse]) -> None:
        self.uses = tuple(uses)
        lines = "; ".join(u.describe() for u in self.uses)
        super().__init__(f"unsupported ops ({len(self.uses)}): {lines}")

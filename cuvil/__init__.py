"""Cuvil: an ahead-of-time compiler for AI inference, with verification built in."""

from __future__ import annotations

from cuvil.api import compile, multiple_of  # noqa: A004  (the library's main verb)
from cuvil.errors import CuvilError, InputError, IRError, ModelError, ShapeError, UnsupportedOpError
from cuvil.runtime.compiled import CompiledModel, TensorSpec

__version__ = "0.1.0"

__all__ = [
    "CompiledModel",
    "CuvilError",
    "IRError",
    "InputError",
    "ModelError",
    "ShapeError",
    "TensorSpec",
    "UnsupportedOpError",
    "__version__",
    "compile",
    "multiple_of",
]

"""Cuvil: an ahead-of-time compiler for AI inference, with verification built in."""

from __future__ import annotations

__version__ = "0.1.0"  # first: modules imported below read it

from cuvil.api import compile, multiple_of  # noqa: A004  (the library's main verb)
from cuvil.errors import CuvilError, InputError, IRError, ModelError, ShapeError, UnsupportedOpError
from cuvil.runtime.artifact import load
from cuvil.runtime.compiled import CompiledModel, CompileInfo, TensorSpec

__all__ = [
    "CompileInfo",
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
    "load",
    "multiple_of",
]

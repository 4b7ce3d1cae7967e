"""Cuvil: an ahead-of-time compiler for AI inference, with verification built in."""

from __future__ import annotations

__version__ = "0.1.0"  # first: modules imported below read it

from cuvil import verify  # a callable package: cuvil.verify(model, ...) (see its docstring)
from cuvil.api import compile, multiple_of  # noqa: A004  (the library's main verb)
from cuvil.custom import Arg, CustomOp, CustomOpError, OpSchema, register_op, unregister_op
from cuvil.errors import CuvilError, InputError, IRError, ModelError, ShapeError, UnsupportedOpError
from cuvil.log import set_log_level
from cuvil.options import CompileOptions
from cuvil.runtime.artifact import load
from cuvil.runtime.compiled import BuildInfo, CompiledModel, CompileInfo, TensorSpec

__all__ = [
    "Arg",
    "BuildInfo",
    "CompileInfo",
    "CompileOptions",
    "CompiledModel",
    "CuvilError",
    "CustomOp",
    "CustomOpError",
    "IRError",
    "InputError",
    "ModelError",
    "OpSchema",
    "ShapeError",
    "TensorSpec",
    "UnsupportedOpError",
    "__version__",
    "compile",
    "load",
    "multiple_of",
    "register_op",
    "unregister_op",
    "set_log_level",
    "verify",
]

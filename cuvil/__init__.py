"""Cuvil: an ahead-of-time compiler for AI inference, with verification built in.

The package root is lazy (PEP 562): ``import cuvil`` loads nothing but this module and the version,
so ``import cuvil.ir`` costs the IR and the op declarations only. Each public name below is imported
from the module that owns it on first use (``cuvil.compile`` loads the compiler, ``cuvil.load`` the
runtime), and so is a subpackage named as an attribute (``cuvil.api``). ``cuvil.verify`` is the verification package, which is callable: ``cuvil.verify(model, ...)``
runs the suite (see cuvil/_callable.py for how the package is made callable).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from cuvil import _callable
from cuvil._version import __version__

_callable.install("cuvil.verify")  # before anything imports it

# public name -> "module:attribute" (an empty attribute: the module itself)
_LAZY: dict[str, str] = {
    "Arg": "cuvil.custom:Arg",
    "BuildInfo": "cuvil.runtime.compiled:BuildInfo",
    "CompileInfo": "cuvil.runtime.compiled:CompileInfo",
    "CompileOptions": "cuvil.options:CompileOptions",
    "CompiledModel": "cuvil.runtime.compiled:CompiledModel",
    "CuvilError": "cuvil.errors:CuvilError",
    "CustomOp": "cuvil.custom:CustomOp",
    "CustomOpError": "cuvil.custom:CustomOpError",
    "IRError": "cuvil.errors:IRError",
    "InputError": "cuvil.errors:InputError",
    "ModelError": "cuvil.errors:ModelError",
    "OpSchema": "cuvil.custom:OpSchema",
    "ShapeError": "cuvil.errors:ShapeError",
    "TensorSpec": "cuvil.ir.spec:TensorSpec",
    "UnsupportedOpError": "cuvil.errors:UnsupportedOpError",
    "compile": "cuvil.api:compile",
    "load": "cuvil.runtime.artifact:load",
    "multiple_of": "cuvil.api:multiple_of",
    "register_op": "cuvil.custom:register_op",
    "set_log_level": "cuvil.log:set_log_level",
    "unregister_op": "cuvil.custom:unregister_op",
    "verify": "cuvil.verify:",
    "verify_fleet": "cuvil.verify.fleet:verify_fleet",
}


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
    "set_log_level",
    "unregister_op",
    "verify",
    "verify_fleet",
]
if importlib.util.find_spec("cuvil.options") is not None:  # the options object (imports nothing to look)
    __all__.append("CompileOptions")


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        # a subpackage used as an attribute (``cuvil.api.import_model`` after ``import cuvil``) loads too
        if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        raise AttributeError(f"module 'cuvil' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        raise AttributeError(f"module 'cuvil' has no attribute {name!r} ({module_name} is not part of this "
                             "installation)") from None
    value = getattr(module, attr) if attr else module
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what the names are, for type checkers and editors (nothing is imported at run time)
    from cuvil import verify
    from cuvil.api import compile, multiple_of  # noqa: A004  (the library's main verb)
    from cuvil.custom import Arg, CustomOp, CustomOpError, OpSchema, register_op, unregister_op
    from cuvil.errors import CuvilError, InputError, IRError, ModelError, ShapeError, UnsupportedOpError
    from cuvil.ir.spec import TensorSpec
    from cuvil.log import set_log_level
    from cuvil.runtime.artifact import load
    from cuvil.runtime.compiled import BuildInfo, CompiledModel, CompileInfo
    from cuvil.verify.fleet import verify_fleet

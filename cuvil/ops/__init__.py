"""Cuvil's op set. Importing this package registers every built-in op."""

from __future__ import annotations

import importlib
import pkgutil

from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, all_ops, get, lookup, op, register

_SKIP = {"registry", "common", "sizes"}

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name not in _SKIP and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
importlib.import_module(f"{__name__}.sizes")  # adds size arithmetic to ops declared above

__all__ = ["AttrSpec", "InferCtx", "OpDef", "RefCtx", "all_ops", "get", "lookup", "op", "register"]

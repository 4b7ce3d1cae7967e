"""The ONNX front end: ONNX models (every opset from 7 on) to Cuvil IR."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping

from cuvil.frontends.onnx.importer import convert_model, importer, simple, supported_op_types
from cuvil.frontends.onnx.loader import ModelLike, read_model
from cuvil.ir.graph import Graph
from cuvil.ir.types import SymbolInfo

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("ops_"):
        importlib.import_module(f"{__name__}.{_m.name}")


def load_onnx(model: ModelLike, symbols: Mapping[str, SymbolInfo] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as a Cuvil graph.

    ``symbols`` gives constraints for symbolic dims (``dim_param`` names) up front."""
    import cuvil.ops  # noqa: F401  (registers the op set)

    proto, _ = read_model(model)
    return convert_model(proto, symbols)


__all__ = ["importer", "load_onnx", "read_model", "simple", "supported_op_types"]

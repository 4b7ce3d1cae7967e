"""Cuvil's intermediate representation: a typed SSA tensor graph."""

from __future__ import annotations

from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Node, Value
from cuvil.ir.symbolic import UNKNOWN, Dim, DimExpr, parse_dim, sym
from cuvil.ir.types import SymbolInfo, TensorType

__all__ = ["UNKNOWN", "DType", "Dim", "DimExpr", "Graph", "Node", "SymbolInfo", "TensorType", "Value", "parse_dim", "sym"]

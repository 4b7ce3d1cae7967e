"""Structural equality of graphs, optionally ignoring value and node names."""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.ir.graph import Graph, Value


def graphs_equal(a: Graph, b: Graph, *, ignore_names: bool = True) -> bool:
    """Whether two graphs compute the same thing node for node (same order)."""
    return _diff(a, b, ignore_names, {}) is None


def graph_difference(a: Graph, b: Graph, *, ignore_names: bool = True) -> str | None:
    """The first difference between two graphs, or None when they are equal."""
    return _diff(a, b, ignore_names, {})


def _attr_equal(x: Any, y: Any, ignore_names: bool, vmap: dict[Value, Value]) -> bool:
    if isinstance(x, Graph) or isinstance(y, Graph):
        return isinstance(x, Graph) and isinstance(y, Graph) and _diff(x, y, ignore_names, vmap) is None
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return (
            isinstance(x, np.ndarray)
            and isinstance(y, np.ndarray)
            and x.dtype == y.dtype
            and x.shape == y.shape
            and x.tobytes() == y.tobytes()
        )
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(_attr_equal(p, q, ignore_names, vmap) for p, q in zip(x, y))
    return type(x) is type(y) and bool(x == y)


def _diff(a: Graph, b: Graph, ignore_names: bool, vmap: dict[Value, Value]) -> str | None:
    if a.symbols != b.symbols:
        return f"symbols differ: {a.symbols} vs {b.symbols}"
    if len(a.inputs) != len(b.inputs) or len(a.nodes) != len(b.nodes) or len(a.outputs) != len(b.outputs):
        return f"graph {a.name!r}: sizes differ (inputs, nodes, outputs)"

    def bind(x: Value, y: Value) -> str | None:
        if x.type != y.type:
            return f"%{x.name}: type {x.type} vs {y.type}"
        if not ignore_names and x.name != y.name:
            return f"value names {x.name!r} vs {y.name!r}"
        vmap[x] = y
        return None

    for x, y in zip(a.inputs, b.inputs):
        if (d := bind(x, y)) is not None:
            return d
    for i, (m, n) in enumerate(zip(a.nodes, b.nodes)):
        where = f"node {i} ({m.op})"
        if m.op != n.op:
            return f"{where}: op {m.op} vs {n.op}"
        if not ignore_names and m.name != n.name:
            return f"{where}: name {m.name!r} vs {n.name!r}"
        if len(m.inputs) != len(n.inputs) or len(m.outputs) != len(n.outputs):
            return f"{where}: arity differs"
        for xi, yi in zip(m.inputs, n.inputs):
            if (xi is None) != (yi is None) or (xi is not None and vmap.get(xi) is not yi):
                return f"{where}: inputs differ"
        if set(m.attrs) != set(n.attrs):
            return f"{where}: attribute names differ"
        for k in m.attrs:
            if not _attr_equal(m.attrs[k], n.attrs[k], ignore_names, vmap):
                return f"{where}: attribute {k!r} differs"
        for x, y in zip(m.outputs, n.outputs):
            if (d := bind(x, y)) is not None:
                return f"{where}: {d}"
    for x, y in zip(a.outputs, b.outputs):
        if vmap.get(x) is not y:
            return f"graph {a.name!r}: outputs differ"
    return None

"""The loop op's inference: a scan output's leading dim is the trip count where it is known (a
constant, or a size read from a shape that cannot be negative) and unknown otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil.ops  # noqa: F401  (registers the op set)
from cuvil.backends.ref.interpreter import run_graph
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph, Value
from cuvil.ir.symbolic import UNKNOWN, Dim, sym
from cuvil.ir.types import SymbolInfo, TensorType


def _scan_rows(trips: str) -> tuple[Graph, Value]:
    """loop over x [n, 3]: each iteration scans row i of x; the trip count is ``trips`` of x's shape."""
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n")
    x = b.input("x", TensorType(DType.f32, (sym("n"), 3)))
    n = b.add1("shape", [x], {"start": 0, "end": 1})
    if trips == "n - 5":
        n = b.add1("sub", [n, b.constant(np.array([5], np.int64))])
    elif trips == "4":
        n = b.constant(np.array(4, np.int64))
    body = Graph(name="body")
    bb = b.nested(body)
    it = bb.input("i", TensorType(DType.i64, ()))
    cond = bb.input("c", TensorType(DType.bool, ()))
    body.outputs = [bb.add1("identity", [cond]), bb.add1("gather", [x, it], {"axis": 0})]
    (rows,) = b.add("loop", [n, None], {"body": body})
    b.output(rows)
    return b.graph, rows


@pytest.mark.parametrize(("trips", "dim"), [("n", sym("n")), ("n - 5", UNKNOWN), ("4", 4)])
def test_scan_output_takes_the_trip_count(trips: str, dim: Dim) -> None:
    graph, rows = _scan_rows(trips)
    assert rows.type.shape == (dim, 3)
    x = np.arange(18, dtype=np.float32).reshape(6, 3)
    (got,) = run_graph(graph, [x])
    want = {"n": x, "n - 5": x[:1], "4": x[:4]}[trips]
    np.testing.assert_array_equal(got, want)

"""The IR text form: print -> parse -> print is the identity; errors are clear."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import cuvil.ops  # noqa: F401
from cuvil.errors import IRError
from cuvil.ir import DType, Graph, SymbolInfo, TensorType, sym
from cuvil.ir.builder import Builder
from cuvil.ir.equality import graph_difference
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.verify import verify

HOSTILE = ['a"b', "back\\slash", "new\nline", "with space", "int", "*/ #include <stdio.h>", "naïve_名前", "%x", ""]


def _round_trip(g: Graph, *, same_names: bool = True) -> Graph:
    text = print_graph(g)
    g2 = parse_graph(text)
    assert print_graph(g2) == text
    verify(g2)
    assert graph_difference(g, g2, ignore_names=not same_names) is None
    return g2


def test_constants_of_every_dtype_round_trip() -> None:
    b = Builder()
    arrays = [
        np.array([1.5, -0.0, np.inf, -np.inf], np.float32),
        np.array([1e-300, 3.141592653589793], np.float64),
        np.array([65504, -1e-4], np.float16),
        np.array([1.0, 3.0e38], dtype=ml_dtypes.bfloat16),
        np.arange(40, dtype=np.int64).reshape(2, 4, 5),
        np.array([-128, 127], np.int8),
        np.array([2**64 - 1], np.uint64),
        np.array([[True, False]]),
        np.array(7, np.int32),
    ]
    for a in arrays:
        b.output(b.constant(a))
    g2 = _round_trip(b.graph)
    for a, n in zip(arrays, g2.nodes):
        got = n.attrs["value"]
        assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


def test_nan_round_trips() -> None:
    b = Builder()
    b.output(b.constant(np.array([np.nan, 1.0], np.float32)))
    g2 = _round_trip(b.graph)
    assert np.isnan(g2.nodes[0].attrs["value"][0])


def test_symbols_and_symbolic_shapes_round_trip() -> None:
    b = Builder()
    b.graph.symbols.update(
        {"seq len": SymbolInfo("seq len"), "batch": SymbolInfo("batch", 1, 256), "h": SymbolInfo("h", multiple_of=32)}
    )
    x = b.input("x", TensorType(DType.f32, (sym("batch"), 3, sym("h"), sym("seq len"))))
    y = b.input("y", TensorType(DType.f32, (1, 1, 2 * sym("h") + 1 - sym("h") - 1, 1)))
    b.output(b.add1("add", [x, y]))
    g2 = _round_trip(b.graph)
    assert g2.symbols["batch"] == SymbolInfo("batch", 1, 256)
    assert g2.symbols["h"].multiple_of == 32


def test_hostile_names_round_trip() -> None:
    b = Builder()
    xs = [b.input(n, TensorType(DType.f32, (2,))) for n in HOSTILE]
    acc = xs[0]
    for i, x in enumerate(xs[1:]):
        acc = b.add1("add", [acc, x], names=[f"out {HOSTILE[i]}"], node_name=HOSTILE[-2 - i])
    b.output(acc)
    text = print_graph(b.graph)
    # one line per node: no name can break the layout
    assert len(text.splitlines()) == 1 + len(b.graph.nodes) + 2
    g2 = _round_trip(b.graph)
    assert [v.name for v in g2.inputs] == HOSTILE
    assert [n.name for n in g2.nodes] == [HOSTILE[-2 - i] for i in range(len(HOSTILE) - 1)]


def test_duplicate_names_are_made_unique() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (2,)))
    y = b.add1("add", [x, x], names=["x"])
    b.output(b.add1("add", [y, x], names=["x.1"]))
    text = print_graph(b.graph)
    assert "%x.1 = add(%x, %x)" in text and "%x.1.1 = add(%x.1, %x)" in text
    assert print_graph(parse_graph(text)) == text


def test_regions_round_trip() -> None:
    outer = Builder()
    c = outer.input("c", TensorType(DType.bool, ()))
    x = outer.input("x", TensorType(DType.f32, (3,)))
    then_b = Builder(Graph(name="then_branch"), symbols_from=outer.graph)
    then_b.output(then_b.add1("add", [x, x]))
    else_b = Builder(Graph(name="else_branch"), symbols_from=outer.graph)
    else_b.output(else_b.add1("mul", [x, x]))
    (r,) = outer.add("if", [c], {"then_branch": then_b.graph, "else_branch": else_b.graph})
    outer.output(r)
    text = print_graph(outer.graph)
    assert "graph then_branch()" in text
    # both regions were built with their own name counters: the printer makes names unique
    assert "%t1.1 = add(%x, %x)" in text
    _round_trip(outer.graph, same_names=False)


def test_elided_text_is_readable_but_refuses_to_parse() -> None:
    b = Builder()
    b.output(b.constant(np.zeros((100,), np.float32)))
    text = print_graph(b.graph, elide=True)
    assert "elided" in text
    with pytest.raises(IRError, match="elided"):
        parse_graph(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("graph g(%x: f32[2]) {\n  %y = add(%x, %z) : f32[2]\n  return %y\n}", "used before it is defined"),
        ("graph g(%x: f32[2]) {\n  %y = frobnicate(%x) : f32[2]\n  return %y\n}", "unknown op"),
        ("graph g(%x: q7[2]) {\n  return %x\n}", "unknown element type"),
        ("graph g(%x: f32[2]) {\n  return %x\n", "unexpected end"),
        ("graph g(%x: f32[2]) {\n  %x = add(%x, %x) : f32[2]\n  return %x\n}", "defined twice"),
        ("graph g(%x: f32[2]) { \x00 }", "unexpected character"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(IRError, match=message):
        parse_graph(text)

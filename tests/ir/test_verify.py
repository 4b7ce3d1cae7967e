"""The verifier finds each broken rule and says where."""

from __future__ import annotations

import pytest

import cuvil.ops  # noqa: F401
from cuvil.errors import IRError
from cuvil.ir import DType, Graph, Node, TensorType, Value, sym
from cuvil.ir.builder import Builder
from cuvil.ir.equality import graph_difference, graphs_equal
from cuvil.ir.parser import parse_graph
from cuvil.ir.verify import verification_errors, verify

F2 = TensorType(DType.f32, (2,))


def _simple() -> tuple[Builder, Value]:
    b = Builder()
    x = b.input("x", F2)
    y = b.add1("add", [x, x], node_name="the_add")
    b.output(y)
    return b, y


def test_valid_graph_passes() -> None:
    b, _ = _simple()
    verify(b.graph)


def test_wrong_output_type_is_found() -> None:
    b, y = _simple()
    y.type = TensorType(DType.f32, (3,))
    errs = verification_errors(b.graph)
    assert any("the_add" in e and "infers f32[2]" in e for e in errs)


def test_use_before_definition_is_found() -> None:
    b, y = _simple()
    z = Value("z", F2)
    b.graph.nodes.insert(0, Node("add", [y, y], [z], name="early"))
    errs = verification_errors(b.graph)
    assert any("early" in e and "not defined before use" in e for e in errs)


def test_unknown_op_and_bad_attribute() -> None:
    b, _ = _simple()
    b.graph.nodes.append(Node("nope", [], [Value("q", F2)], name="n1"))
    b.graph.nodes[0].attrs["bogus"] = 1
    with pytest.raises(IRError) as exc:
        verify(b.graph)
    assert "unknown op 'nope'" in str(exc.value)
    assert "unknown attribute(s) bogus" in str(exc.value)


def test_double_definition_and_undefined_output() -> None:
    b, y = _simple()
    b.graph.nodes.append(Node("identity", [y], [y]))
    b.graph.outputs.append(Value("ghost", F2))
    errs = verification_errors(b.graph)
    assert any("defined twice" in e for e in errs)
    assert any("ghost" in e and "not defined" in e for e in errs)


def test_undeclared_symbol() -> None:
    g = Graph(inputs=[Value("x", TensorType(DType.f32, (sym("n"),)))])
    g.outputs = list(g.inputs)
    assert any("undeclared symbol" in e for e in verification_errors(g))


def test_structural_equality_ignores_names_when_asked() -> None:
    a = parse_graph("graph g(%x: f32[2]) {\n  %y = add(%x, %x) : f32[2]\n  return %y\n}")
    b = parse_graph("graph g(%p: f32[2]) {\n  %q = add(%p, %p) : f32[2]\n  return %q\n}")
    c = parse_graph("graph g(%p: f32[2]) {\n  %q = mul(%p, %p) : f32[2]\n  return %q\n}")
    assert graphs_equal(a, b)
    assert not graphs_equal(a, b, ignore_names=False)
    assert "op add vs mul" in (graph_difference(a, c) or "")

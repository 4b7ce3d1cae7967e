"""Shape relations: proven from the constraints, refuted at compile time, or checked at run time.

Each run-time case is checked on the reference target (the Python input guard)
and, for the C targets, both through the guard and by calling the library
directly, so the checks generated into ``cuvil_run`` are exercised too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cuvil
from cuvil.backends.c.library import RunError
from cuvil.errors import InputError, IRError, ShapeError
from cuvil.ir.assumptions import BROADCAST, BROADCAST_TO, EQUAL, Assumption, decide
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.parser import parse_graph
from cuvil.ir.printer import print_graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType
from cuvil.ops.common import graph_assumptions

f32 = DType.f32


def graph_of(inputs: dict[str, tuple[object, ...]], op: str, attrs: dict[str, object] | None = None,
             symbols: dict[str, SymbolInfo] | None = None) -> Graph:
    """One ``op`` node named 'n' over inputs of the given shapes (str items are symbols)."""
    b = Builder()
    names = {d for shape in inputs.values() for d in shape if isinstance(d, str)}
    b.graph.symbols = {n: SymbolInfo(n) for n in sorted(names)} | dict(symbols or {})
    vals = [b.input(k, TensorType(f32, tuple(sym(d) if isinstance(d, str) else d for d in shape)))
            for k, shape in inputs.items()]
    b.output(b.add1(op, vals, attrs or {}, node_name="n"))
    return b.graph


def ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


# deciding -------------------------------------------------------------------------------------


def test_decide_proves_refutes_or_defers() -> None:
    syms = {"batch": SymbolInfo("batch", 1, 64), "h": SymbolInfo("h", None, None, 32), "big": SymbolInfo("big", 2, None),
            "one": SymbolInfo("one", 1, 1)}
    b, h, n = sym("batch"), sym("h"), sym("n")
    assert decide(EQUAL, b, b, syms) is True
    assert decide(EQUAL, 2 * n, n + n, syms) is True  # the same polynomial
    assert decide(EQUAL, sym("one"), 1, syms) is True  # forced by min == max
    assert decide(EQUAL, n, n + 1, syms) is False
    assert decide(EQUAL, b, 128, syms) is False  # batch is at most 64
    assert decide(EQUAL, h, 17, syms) is False  # h is a multiple of 32
    assert decide(EQUAL, 2 * h, 2 * n + 1, syms) is False  # even vs odd
    assert decide(EQUAL, b, 7, syms) is None
    assert decide(EQUAL, b, n, syms) is None
    assert decide(BROADCAST, n, 1, syms) is True
    assert decide(BROADCAST, sym("big"), 3, syms) is None
    assert decide(BROADCAST, sym("big"), h + 1, syms) is None
    assert decide(BROADCAST, h + 2, 3, syms) is False  # h + 2 is never 1 nor 3
    assert decide(BROADCAST_TO, sym("one"), n, syms) is True
    assert decide(BROADCAST_TO, n, sym("big"), syms) is None
    assert decide(BROADCAST_TO, sym("big"), 1, syms) is False


def test_assumption_round_trips_through_json() -> None:
    a = Assumption(BROADCAST, sym("a") * 2 + 1, sym("b"), "the operands' dims at output axis 0", "add", "n1")
    assert Assumption.from_json(a.to_json()) == a
    assert a.check({"a": 1, "b": 3}) is None
    assert a.check({"a": 1, "b": 1}) is None
    assert a.check({"a": 2}) is None  # b unbound: left to the kernels
    assert a.check({"a": 2, "b": 4}) == (
        "node 'n1' (add): the operands' dims at output axis 0 do not broadcast: 5 vs 4 (2*a + 1 = 5, b = 4)")


# recording and the run-time checks ---------------------------------------------------------------

TARGETS = ["ref", "generic"]


def expect_rejected(m: cuvil.CompiledModel, arrays: list[np.ndarray], message: str) -> None:
    with pytest.raises(InputError) as info:
        m(*arrays)
    assert str(info.value) == message
    if m.target != "ref":  # the same check, generated into cuvil_run (standalone C and wasm callers)
        with pytest.raises(RunError) as c_info:
            m._executor.run(arrays, {})
        assert str(c_info.value) == message


@pytest.mark.parametrize("target", TARGETS)
def test_concat_of_different_symbols_is_checked_at_run_time(target: str, cache: Path) -> None:
    g = graph_of({"x": ("batch", "n"), "y": ("batch2", "m")}, "concat", {"axis": 1})
    assert [(a.kind, str(a.lhs), str(a.rhs), a.node) for a in graph_assumptions(g)] == [
        ("equal", "batch", "batch2", "n")]
    m = cuvil.compile(g, target, cache_dir=str(cache))
    (y,) = m(ones(2, 3), ones(2, 4))
    np.testing.assert_array_equal(y, np.ones((2, 7), np.float32))
    expect_rejected(m, [ones(2, 3), ones(3, 4)],
                    "node 'n' (concat): dim 0 of the inputs (not the concat axis) differ: 2 != 3 (batch = 2, batch2 = 3)")


@pytest.mark.parametrize("target", TARGETS)
def test_matmul_with_symbolic_inner_dims_is_checked_at_run_time(target: str, cache: Path) -> None:
    g = graph_of({"a": ("b", "k1"), "w": ("k2", "n")}, "matmul")
    m = cuvil.compile(g, target, cache_dir=str(cache))
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
    (y,) = m(a, w)
    np.testing.assert_allclose(y, a @ w, rtol=1e-5, atol=1e-6)
    expect_rejected(m, [ones(3, 5), ones(4, 2)], "node 'n' (matmul): inner dims differ: 5 != 4 (k1 = 5, k2 = 4)")


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_of_two_symbols_is_checked_at_run_time(target: str, cache: Path) -> None:
    g = graph_of({"x": ("a",), "y": ("b",)}, "add")
    assert g.outputs[0].type.shape == (cuvil.ir.symbolic.broadcast_dim(sym("a"), sym("b")),)
    m = cuvil.compile(g, target, cache_dir=str(cache))
    for na, nb in ((4, 4), (1, 4), (4, 1)):
        (y,) = m(ones(na), np.full(nb, 2, np.float32))
        np.testing.assert_array_equal(y, np.full(max(na, nb), 3, np.float32))
    expect_rejected(m, [ones(3), ones(4)],
                    "node 'n' (add): the operands' dims at output axis 0 do not broadcast: 3 vs 4 (a = 3, b = 4)")


@pytest.mark.parametrize("target", TARGETS)
def test_broadcast_against_a_static_dim_is_checked(target: str, cache: Path) -> None:
    # [a] + [3] infers [3]: valid only for a in {1, 3}, which is checked, not assumed.
    g = graph_of({"x": ("a",), "y": (3,)}, "mul")
    m = cuvil.compile(g, target, cache_dir=str(cache))
    assert m(ones(1), ones(3))[0].shape == (3,)
    expect_rejected(m, [ones(2), ones(3)],
                    "node 'n' (mul): the operands' dims at output axis 0 do not broadcast: 2 vs 3 (a = 2)")


def test_gemm_and_layer_norm_parameters_are_checked(cache: Path) -> None:
    g = graph_of({"x": ("m", "k"), "w": ("k2", 4), "c": ("c0",)}, "gemm")
    assert [a.describe() for a in graph_assumptions(g)] == ["k == k2", "c0 ~> 4"]
    m = cuvil.compile(g, "ref")
    with pytest.raises(InputError, match=r"C's dim 0 and the output's dim 1 do not broadcast: 3 is neither 1 nor 4"):
        m(ones(2, 5), ones(5, 4), ones(3))
    g = graph_of({"x": ("n", "d"), "s": ("e",)}, "layer_norm", {"axis": -1})
    m = cuvil.compile(g, "ref")
    assert m(ones(2, 6), ones(6))[0].shape == (2, 6)
    with pytest.raises(InputError, match=r"Scale's dim 0 and the input's dim 1 do not broadcast: 5 is neither 1 nor 6"):
        m(ones(2, 6), ones(5))


def test_checks_are_deduplicated_and_reach_saved_artifacts(tmp_path: Path) -> None:
    b = Builder()
    b.graph.symbols = {"a": SymbolInfo("a"), "b": SymbolInfo("b")}
    x = b.input("x", TensorType(f32, (sym("a"),)))
    y = b.input("y", TensorType(f32, (sym("b"),)))
    s = b.add1("add", [x, y], node_name="first")
    t = b.add1("sub", [x, y], node_name="second")  # the same relation: checked once, naming the first node
    b.output(b.add1("mul", [s, t], node_name="third"))
    checks = graph_assumptions(b.graph)
    assert [(c.node, c.describe()) for c in checks] == [("first", "a ~ b")]
    m = cuvil.compile(b.graph, "generic", cache_dir=str(tmp_path / "cache"))
    m.save(tmp_path / "art")
    loaded = cuvil.load(tmp_path / "art")
    assert loaded.signature.checks == m.signature.checks
    with pytest.raises(InputError, match=r"node 'first' \(add\): .* do not broadcast: 2 vs 5"):
        loaded(ones(2), ones(5))


def test_checks_are_rederived_from_the_text_form() -> None:
    g = graph_of({"x": ("batch", "n"), "y": ("batch2", "m")}, "concat", {"axis": 1})
    parsed = parse_graph(print_graph(g))
    assert graph_assumptions(parsed) == graph_assumptions(g)


# refuted at compile time -------------------------------------------------------------------------


def test_provably_false_relations_fail_to_compile() -> None:
    with pytest.raises(ShapeError, match=r"matmul: inner dims differ: n != n \+ 1 for any allowed value"):
        b = Builder()
        b.graph.symbols = {"n": SymbolInfo("n")}
        x = b.input("x", TensorType(f32, (2, sym("n"))))
        y = b.input("y", TensorType(f32, (sym("n") + 1, 3)))
        b.add1("matmul", [x, y])
    h32 = {"h": SymbolInfo("h", None, None, 32)}
    with pytest.raises(ShapeError, match=r"concat: dim 1 of the inputs \(not the concat axis\) differ: h != 17 "
                                         r"for any allowed value \(h %32\)"):
        graph_of({"x": (1, "h"), "y": (1, 17)}, "concat", {"axis": 0}, h32)
    bounded = {"a": SymbolInfo("a", 2, 10)}
    with pytest.raises(ShapeError, match=r"add: the operands' dims at output axis 0 do not broadcast: a and 16 "
                                         r"for any allowed value \(a 2\.\.10\)"):
        graph_of({"x": ("a",), "y": (16,)}, "add", None, bounded)


def test_constraints_given_at_compile_time_refute_relations() -> None:
    # Built unconstrained (a run-time check), then compiled with dims= that rule it out.
    g = graph_of({"x": ("b", "k"), "w": (64, 8)}, "matmul")
    assert [c.describe() for c in graph_assumptions(g)] == ["k == 64"]
    with pytest.raises(IRError, match=r"inner dims differ: k != 64 for any allowed value \(k 1\.\.32\)"):
        cuvil.compile(g, "ref", dims={"k": (1, 32)})


def test_proven_relations_leave_no_check() -> None:
    g = graph_of({"x": ("batch", "seq", 64), "w": (64, 32)}, "matmul")
    assert graph_assumptions(g) == []
    g = graph_of({"x": ("batch", "n"), "y": ("batch", "m")}, "concat", {"axis": 1})
    assert graph_assumptions(g) == []
    g = graph_of({"x": ("a",), "y": ("one",)}, "add", None, {"one": SymbolInfo("one", 1, 1)})
    assert graph_assumptions(g) == []


def test_unknown_dims_are_left_to_the_kernels() -> None:
    b = Builder()
    b.graph.symbols = {"n": SymbolInfo("n")}
    x = b.input("x", TensorType(f32, (sym("n"),)))
    nz = b.add1("non_zero", [x])  # [1, ?]: data-dependent
    flat = b.add1("reshape", [nz, b.constant(np.array([-1], np.int64))])
    b.output(b.add1("add", [b.add1("cast", [flat], {"to": f32}), x]))
    assert graph_assumptions(b.graph) == []

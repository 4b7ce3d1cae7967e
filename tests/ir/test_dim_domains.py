"""Dim domains: each input symbol's smallest valid extent, derived from what the graph's nodes need
(windows that fit, relations that hold, reshapes and splits that divide evenly), over the declared
constraints; checked against the reference interpreter where it can say which extents run."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.errors import CuvilError
from cuvil.ir.builder import Builder
from cuvil.ir.dim_domains import analyse_dims, merge_info
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType

f32 = DType.f32


def _ocr(width_info: SymbolInfo | None = None) -> Graph:
    """conv 3x3 (pad 1) -> max_pool 2 stride 2 -> conv 3x3 (no pad) -> max_pool 2x2 stride (2, 1), over a
    symbolic width: the last window needs floor(w / 2) - 2 >= 2, so w >= 8."""
    b = Builder()
    b.graph.symbols["w"] = width_info or SymbolInfo("w")
    x = b.input("x", TensorType(f32, (1, 1, 16, sym("w"))))
    rng = np.random.default_rng(0)
    c1 = b.add1("conv", [x, b.constant(rng.standard_normal((2, 1, 3, 3)).astype(np.float32))], {"pads": [1, 1, 1, 1]})
    p1 = b.add1("max_pool", [c1], {"kernel_shape": [2, 2], "strides": [2, 2]}, node_name="pool1")
    c2 = b.add1("conv", [p1, b.constant(rng.standard_normal((2, 2, 3, 3)).astype(np.float32))], node_name="conv2")
    p2 = b.add1("max_pool", [c2], {"kernel_shape": [2, 2], "strides": [2, 1]}, node_name="pool2")
    b.graph.outputs = [p2]
    return b.graph


def _runs_at(graph: Graph, w: int) -> bool:
    """Whether the reference interpreter runs ``graph`` with the width at ``w``."""
    model = cuvil.compile(graph, target="ref")
    try:
        model(np.zeros((1, 1, 16, w), np.float32))
    except CuvilError:
        return False
    return True


def test_the_smallest_valid_width_is_the_smallest_the_reference_runs() -> None:
    g = _ocr()
    dom = analyse_dims(g).domains()["w"]
    runs = [w for w in range(1, 14) if _runs_at(g, w)]
    assert dom.min == runs[0] == 8
    assert "pool2" in dom.reasons[0] and "window must fit" in dom.reasons[0]
    assert analyse_dims(g).violation({"w": 7}) is not None and analyse_dims(g).violation({"w": 8}) is None


def test_a_declared_minimum_and_multiple_are_kept_over_the_derived_extent() -> None:
    assert analyse_dims(_ocr(SymbolInfo("w", min=10))).domains()["w"].min == 10
    assert analyse_dims(_ocr(SymbolInfo("w", multiple_of=3))).domains()["w"].min == 9
    declared = analyse_dims(_ocr(), {"w": SymbolInfo("w", multiple_of=5)}).domains()["w"]  # the user's, merged
    assert (declared.min, declared.multiple_of) == (10, 5)


def test_a_typical_extent_is_used_where_the_graph_is_valid_and_dropped_where_it_is_not() -> None:
    good = analyse_dims(_ocr(), typical={"w": (320, "the example's extent")})
    assert good.sample_env() == {"w": 320} and good.domains()["w"].min == 8
    assert "320 (the example's extent)" in good.domains()["w"].describe()
    bad = analyse_dims(_ocr(), typical={"w": (5, "the example's extent")})
    assert bad.sample_env() == {"w": 8} and bad.domains()["w"].typical is None
    assert "the typical 5 (the example's extent) is not valid: " in bad.domains()["w"].describe()


def test_concat_ties_two_symbols_and_a_held_value_moves_the_other() -> None:
    b = Builder()
    a = b.input("a", TensorType(f32, (2, sym("s"))))
    c = b.input("c", TensorType(f32, (3, sym("t"))))
    b.graph.symbols.update({"s": SymbolInfo("s", min=4), "t": SymbolInfo("t")})
    b.graph.outputs = [b.add1("concat", [a, c], {"axis": 0})]
    an = analyse_dims(b.graph)
    assert {k: d.min for k, d in an.domains().items()} == {"s": 4, "t": 4}
    env, why = an.values({"t": 9})
    assert env == {"s": 9, "t": 9} and why is None
    env, why = an.values({"s": 4, "t": 5})
    assert why is not None and "concat" in why


def test_a_reshape_to_minus_one_by_8_needs_a_multiple_and_the_next_valid_value_skips_the_others() -> None:
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n")
    x = b.input("x", TensorType(f32, (sym("n"), 3)))
    b.graph.outputs = [b.add1("reshape", [x, b.constant(np.array([-1, 8], np.int64))], node_name="to_rows")]
    an = analyse_dims(b.graph)
    dom = an.domains()["n"]
    assert dom.min == 8 and "to_rows" in dom.reasons[0]
    assert an.next_valid("n", 9) == 16 and an.violation({"n": 12}) is not None
    model = cuvil.compile(b.graph, target="ref")
    assert model(np.zeros((16, 3), np.float32))[0].shape == (6, 8)
    with pytest.raises(CuvilError):  # 36 elements are not rows of 8
        model(np.zeros((12, 3), np.float32))


def test_split_sizes_fix_the_symbol_they_partition() -> None:
    b = Builder()
    b.graph.symbols["k"] = SymbolInfo("k")
    x = b.input("x", TensorType(f32, (sym("k"), 2)))
    parts = b.add("split", [x, b.constant(np.array([2, 3], np.int64))], {"axis": 0}, num_outputs=2)
    b.graph.outputs = list(parts)
    an = analyse_dims(b.graph)
    assert an.domains()["k"].min == 5 and an.violation({"k": 6}) is not None


def test_an_unsatisfiable_graph_says_why_and_keeps_the_declared_value() -> None:
    b = Builder()
    b.graph.symbols["s"] = SymbolInfo("s", max=4)
    x = b.input("x", TensorType(f32, (1, 1, sym("s"))))
    b.graph.outputs = [b.add1("max_pool", [x], {"kernel_shape": [6]}, node_name="wide")]
    dom = analyse_dims(b.graph).domains()["s"]
    assert dom.problem is not None and "wide" in dom.problem and "no valid extent" in dom.describe()


@pytest.mark.parametrize(("infos", "want"), [
    ((SymbolInfo("s", 2, 100, 4), SymbolInfo("s", 5, 50, 6)), SymbolInfo("s", 5, 50, 12)),
    ((None, SymbolInfo("s", max=3)), SymbolInfo("s", None, 3, None)),
])
def test_merged_constraints_hold_every_one(infos: tuple[SymbolInfo | None, ...], want: SymbolInfo) -> None:
    assert merge_info("s", *infos) == want

"""Input domains inferred from the graph: index ranges of the tables an input reaches, 0/1 masks."""

from __future__ import annotations

import numpy as np

from cuvil.ir.builder import Builder
from cuvil.ir.domains import Domain, infer_domains
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph
from cuvil.ir.samples import random_inputs
from cuvil.ir.spec import TensorSpec
from cuvil.ir.symbolic import sym
from cuvil.ir.types import SymbolInfo, TensorType

i64, f32 = DType.i64, DType.f32


def _embedding_graph() -> Graph:
    """ids -> cast i32 -> add 2 -> gather(table 30x8); positions -> gather(table 6x8) and gather(10x8);
    mask -> cast f32 -> 1 - mask -> * -1e4."""
    b = Builder()
    b.graph.symbols["s"] = SymbolInfo("s", min=1)
    s = sym("s")
    ids = b.input("ids", TensorType(i64, (1, s)))
    pos = b.input("pos", TensorType(i64, (1, s)))
    mask = b.input("mask", TensorType(i64, (1, s)))
    count = b.input("count", TensorType(i64, (1,)))
    words = b.constant(np.zeros((30, 8), np.float32), name="words")
    shifted = b.add1("add", [b.add1("cast", [ids], {"to": DType.i32}), b.constant(np.int32(2))])
    e = b.add1("gather", [words, shifted], {"axis": 0}, node_name="word_lookup")
    p1 = b.add1("gather", [b.constant(np.zeros((6, 8), np.float32), name="positions"), pos], {"axis": 0})
    p2 = b.add1("gather", [b.constant(np.zeros((10, 8), np.float32), name="more"), pos], {"axis": 0})
    m = b.add1("cast", [mask], {"to": f32})
    neg = b.add1("mul", [b.add1("sub", [b.constant(np.float32(1.0)), m]), b.constant(np.float32(-1e4))])
    c = b.add1("cast", [count], {"to": f32})
    out = b.add1("add", [b.add1("add", [b.add1("add", [e, p1]), p2]), b.add1("unsqueeze", [neg, b.constant(np.int64([-1]))])])
    b.graph.outputs = [out, b.add1("add", [c, c])]
    return b.graph


def test_an_index_input_is_drawn_within_the_table_after_the_added_constant() -> None:
    d = infer_domains(_embedding_graph())
    assert (d["ids"].low, d["ids"].high) == (0, 27)  # ids + 2 indexes 30 rows
    assert "indexes words (word_lookup)" in d["ids"].source


def test_an_input_indexing_two_tables_takes_their_intersection() -> None:
    d = infer_domains(_embedding_graph())["pos"]
    assert (d.low, d.high) == (0, 5)
    assert "positions" in d.source and "more" in d.source


def test_a_mask_is_drawn_as_zeros_and_ones_and_other_inputs_keep_the_default() -> None:
    g = _embedding_graph()
    d = infer_domains(g)
    assert d["mask"].mask and "subtracted from 1" in d["mask"].source
    assert "count" not in d  # only added to itself: nothing says what it holds
    specs = [TensorSpec(v.name, v.type) for v in g.inputs]
    for seed in range(5):
        ids, pos, mask, _ = random_inputs(specs, g.symbols, seed=seed, values={"s": 9},
                                          domains=[d.get(v.name) for v in g.inputs])
        assert ids.min() >= 0 and ids.max() <= 27 and pos.max() <= 5
        assert set(np.unique(mask)) <= {0, 1} and mask[:, 0].all()
        # right padding: once a row has a zero, the rest of it is zero
        assert all(np.all(np.diff(row) <= 0) for row in mask)


def test_masks_by_where_and_comparison_and_a_one_hot_depth() -> None:
    b = Builder()
    keep = b.input("keep", TensorType(i64, (2, 4)))
    label = b.input("label", TensorType(i64, (2,)))
    x = b.input("x", TensorType(f32, (2, 4)))
    cond = b.add1("equal", [keep, b.constant(np.int64(0))])
    y = b.add1("where", [cond, b.constant(np.float32(-1e9)), x])
    hot = b.add1("one_hot", [label, b.constant(np.int64([5])), b.constant(np.float32([0, 1]))], {"axis": -1})
    b.graph.outputs = [y, hot]
    d = infer_domains(b.graph)
    assert d["keep"].mask and "compared with 0" in d["keep"].source
    assert (d["label"].low, d["label"].high) == (0, 4)
    assert "x" not in d


def test_an_empty_intersection_infers_nothing() -> None:
    b = Builder()
    ids = b.input("ids", TensorType(i64, (3,)))
    far = b.add1("add", [ids, b.constant(np.int64(50))])
    b.graph.outputs = [b.add1("gather", [b.constant(np.zeros((10, 2), np.float32)), far], {"axis": 0})]
    assert infer_domains(b.graph) == {}


def test_declared_values_and_float_ranges_are_drawn_from() -> None:
    rng = np.random.default_rng(0)
    v = Domain("declared", values=(3.0, 7.0)).draw(TensorType(i64, (50,)), (50,), rng)
    assert set(np.unique(v)) == {3, 7}
    f = Domain("declared", low=2.0, high=3.0).draw(TensorType(f32, (50,)), (50,), rng)
    assert f.dtype == np.float32 and f.min() >= 2.0 and f.max() <= 3.0


def test_a_float_product_is_a_mask_and_an_integer_product_is_not() -> None:
    b = Builder()
    keep = b.input("keep", TensorType(i64, (2, 4)))
    scale = b.input("scale", TensorType(i64, (2, 4)))
    x = b.input("x", TensorType(f32, (2, 4)))
    y = b.add1("mul", [x, b.add1("cast", [keep], {"to": f32})])
    b.graph.outputs = [y, b.add1("mul", [scale, scale])]
    d = infer_domains(b.graph)
    assert d["keep"].mask and "multiplied" in d["keep"].source
    assert "scale" not in d

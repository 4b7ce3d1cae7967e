"""Inputs are checked against the model's contract before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

import cuvil
from cuvil.ir import DType, SymbolInfo, TensorType, sym
from cuvil.ir.builder import Builder


def _model(**constraints: SymbolInfo) -> cuvil.CompiledModel:
    b = Builder()
    b.graph.symbols.update({"batch": SymbolInfo("batch"), "h": SymbolInfo("h")})
    b.graph.symbols.update(constraints)
    x = b.input("image", TensorType(DType.f32, (sym("batch"), 3, sym("h"))))
    y = b.input("bias", TensorType(DType.f32, (1, 3, 1)))
    b.output(b.add1("add", [x, y], names=["out"]))
    return cuvil.compile(b.graph)


def test_runs_every_valid_shape() -> None:
    m = _model()
    for batch, h in [(1, 1), (7, 5), (2, 64)]:
        x = np.random.rand(batch, 3, h).astype(np.float32)
        bias = np.ones((1, 3, 1), np.float32)
        (out,) = m(x, bias)
        np.testing.assert_array_equal(out, x + 1)
        assert m.run({"image": x, "bias": bias})["out"].shape == (batch, 3, h)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((np.zeros((1, 3, 4), np.float32),), r"expected 2 inputs \('image', 'bias'\), got 1"),
        ((np.zeros((1, 3, 4), np.float64), np.zeros((1, 3, 1), np.float32)), "input 'image': expected element type f32, got float64"),
        ((np.zeros((1, 4, 4), np.float32), np.zeros((1, 3, 1), np.float32)), r"input 'image': expected shape \[batch, 3, h\], got \[1, 4, 4\] \(dim 1 must be 3\)"),
        ((np.zeros((1, 3), np.float32), np.zeros((1, 3, 1), np.float32)), r"input 'image': expected shape \[batch, 3, h\] \(rank 3\), got \[1, 3\] \(rank 2\)"),
    ],
)
def test_bad_inputs_are_named(args: tuple[np.ndarray, ...], message: str) -> None:
    with pytest.raises(cuvil.InputError, match=message):
        _model()(*args)


def test_symbol_constraints_are_enforced() -> None:
    m = _model(batch=SymbolInfo("batch", 1, 8), h=SymbolInfo("h", multiple_of=4))
    bias = np.zeros((1, 3, 1), np.float32)
    m(np.zeros((8, 3, 12), np.float32), bias)
    with pytest.raises(cuvil.InputError, match="batch=9 is above its maximum 8"):
        m(np.zeros((9, 3, 12), np.float32), bias)
    with pytest.raises(cuvil.InputError, match="batch=0 is below its minimum 1"):
        m(np.zeros((0, 3, 12), np.float32), bias)
    with pytest.raises(cuvil.InputError, match="h=10 is not a multiple of 4"):
        m(np.zeros((1, 3, 10), np.float32), bias)


def test_one_symbol_must_agree_across_inputs() -> None:
    b = Builder()
    b.graph.symbols["n"] = SymbolInfo("n")
    x = b.input("x", TensorType(DType.f32, (sym("n"),)))
    y = b.input("y", TensorType(DType.f32, (sym("n"),)))
    b.output(b.add1("add", [x, y]))
    m = cuvil.compile(b.graph)
    with pytest.raises(cuvil.InputError, match="input 'y': dim 0 is n=3, but input 'x' dim 0 gave n=2"):
        m(np.zeros(2, np.float32), np.zeros(3, np.float32))


def test_run_by_name_checks_names() -> None:
    m = _model()
    with pytest.raises(cuvil.InputError, match="missing 'bias'; unknown 'typo'"):
        m.run({"image": np.zeros((1, 3, 1), np.float32), "typo": 1})


def test_dims_option_constrains_onnx_symbols(tmp_path: object) -> None:
    m = cuvil.compile(_model().graph, dims={"batch": (1, 4), "h": cuvil.multiple_of(2)})
    assert m.symbols["batch"].max == 4
    with pytest.raises(cuvil.InputError, match="h=3 is not a multiple of 2"):
        m(np.zeros((1, 3, 3), np.float32), np.zeros((1, 3, 1), np.float32))
    with pytest.raises(cuvil.CuvilError, match="no symbolic dim 'nope'"):
        cuvil.compile(_model().graph, dims={"nope": (1, 2)})

"""matmul, gemm and einsum: results against onnxruntime/NumPy, shape inference with symbolic dims,
and error messages."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil.errors import CuvilError, ShapeError
from cuvil.ir.builder import Builder
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import sym
from cuvil.ir.types import TensorType
from cuvil.ops.linalg import parse_equation
from tests.support.reduce_models import check_against_ort, run_cuvil
from tests.support.single_node import one_node

RNG = np.random.default_rng(2)


def _randn(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((4,), (4,)),
        ((4,), (2, 4, 3)),
        ((2, 3, 4), (4,)),
        ((3, 4), (4, 5)),
        ((2, 1, 3, 4), (5, 4, 2)),
        ((1, 3, 4), (6, 4, 2)),
    ],
)
def test_matmul_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    inputs = {"a": _randn(a_shape), "b": _randn(b_shape)}
    (y,) = check_against_ort("MatMul", inputs, opset=13, rtol=1e-5)
    assert y.shape == np.matmul(inputs["a"], inputs["b"]).shape


def test_matmul_integers_are_exact() -> None:
    inputs = {"a": RNG.integers(-100, 100, (3, 4)), "b": RNG.integers(-100, 100, (4, 2))}
    (y,) = check_against_ort("MatMul", inputs, opset=9)
    np.testing.assert_array_equal(y, inputs["a"] @ inputs["b"])


def test_matmul_half_accumulates_in_float32() -> None:
    a = np.full((1, 4096), 1.0, np.float16)
    b = np.full((4096, 1), 1.0, np.float16)
    (y,) = run_cuvil(one_node("MatMul", {"a": a, "b": b}, ["y"], 13), {"a": a, "b": b})
    assert y.dtype == np.float16 and float(y[0, 0]) == 4096.0


def test_matmul_shape_inference() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("batch"), sym("seq"), 64)))
    w = b.input("w", TensorType(DType.f32, (64, 128)))
    assert b.add1("matmul", [x, w]).type.shape == (sym("batch"), sym("seq"), 128)
    bad = b.input("bad", TensorType(DType.f32, (32, 128)))
    with pytest.raises(ShapeError, match="inner dims differ"):
        b.add1("matmul", [x, bad])
    s = b.input("s", TensorType(DType.f32, ()))
    with pytest.raises(ShapeError, match="rank >= 1"):
        b.add1("matmul", [s, w])
    i = b.input("i", TensorType(DType.i32, (64, 2)))
    with pytest.raises(ShapeError, match="share one element type"):
        b.add1("matmul", [x, i])


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (1,), (5,), (3, 1), (3, 5)])
def test_gemm(trans_a: int, trans_b: int, c_shape: tuple[int, ...] | None) -> None:
    a = RNG.standard_normal((4, 3) if trans_a else (3, 4)).astype(np.float32)
    b = RNG.standard_normal((5, 4) if trans_b else (4, 5)).astype(np.float32)
    inputs = {"a": a, "b": b}
    if c_shape is not None:
        inputs["c"] = RNG.standard_normal(c_shape).astype(np.float32)
    (y,) = check_against_ort("Gemm", inputs, opset=13, alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b)
    assert y.shape == (3, 5)


def test_gemm_old_opset_broadcast_attribute() -> None:
    inputs = {
        "a": RNG.standard_normal((3, 4)).astype(np.float32),
        "b": RNG.standard_normal((4, 5)).astype(np.float32),
        "c": RNG.standard_normal((5,)).astype(np.float32),
    }
    (y,) = run_cuvil(one_node("Gemm", inputs, ["y"], 6, broadcast=1), inputs)  # onnxruntime lacks Gemm-6
    np.testing.assert_allclose(y, inputs["a"] @ inputs["b"] + inputs["c"], rtol=1e-5, atol=1e-6)
    with pytest.raises(CuvilError, match="with broadcast=0, C must have the output shape"):
        run_cuvil(one_node("Gemm", inputs, ["y"], 6), inputs)


def test_gemm_rejects_mismatched_inner_dims() -> None:
    b = Builder()
    a = b.input("a", TensorType(DType.f32, (3, 4)))
    w = b.input("w", TensorType(DType.f32, (5, 4)))
    with pytest.raises(ShapeError, match="inner dims differ"):
        b.add1("gemm", [a, w])
    assert b.add1("gemm", [a, w], {"transB": 1}).type.shape == (3, 5)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("ij,jk->ik", [(2, 3), (3, 4)]),
        ("bij,bjk->bik", [(2, 2, 3), (2, 3, 4)]),
        ("ii->i", [(4, 4)]),
        ("...ii ->...i", [(3, 5, 5)]),
        ("i,i", [(5,), (5,)]),
        ("ij->", [(3, 4)]),
        ("ji", [(3, 4)]),
        ("bA,Ab", [(2, 3), (3, 2)]),
        ("...j,j...->...", [(2, 3, 4), (4, 3)]),
        ("ab,cd->abcd", [(2, 3), (4, 1)]),
        ("iij->j", [(3, 3, 2)]),
    ],
)
def test_einsum_matches_numpy(equation: str, shapes: list[tuple[int, ...]]) -> None:
    arrays = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    (y,) = run_cuvil(one_node("Einsum", inputs, ["y"], 12, equation=equation), inputs)
    want = np.einsum(equation.replace(" ", ""), *arrays)
    assert y.shape == want.shape
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_einsum_against_onnxruntime() -> None:
    inputs = {"a": _randn((2, 3, 4)), "b": _randn((2, 4, 5))}
    check_against_ort("Einsum", inputs, opset=12, equation="bij,bjk->bik")


def test_einsum_implicit_output_is_ascii_ordered() -> None:
    eq = parse_equation("bA,Ac", 2)
    assert eq.output == ("b", "c")
    assert parse_equation("zB", 1).output == ("B", "z")
    assert parse_equation("...ij,jk", 2).output == ("...", "i", "k")


def test_einsum_shape_inference_symbolic() -> None:
    b = Builder()
    x = b.input("x", TensorType(DType.f32, (sym("n"), sym("s"), 8)))
    w = b.input("w", TensorType(DType.f32, (8, 16)))
    assert b.add1("einsum", [x, w], {"equation": "...d,de->...e"}).type.shape == (sym("n"), sym("s"), 16)
    assert b.add1("einsum", [x], {"equation": "nsd->dn"}).type.shape == (8, sym("n"))


@pytest.mark.parametrize(
    ("equation", "shapes", "message"),
    [
        ("ij,jk->ik", [(2, 3), (4, 5)], "label 'j' stands for dims 3 and 4"),
        ("ij->ik", [(2, 3)], "output label 'k' does not occur"),
        ("ijk->i", [(2, 3)], "has 3 labels"),
        ("ii->i", [(2, 3)], "label 'i' of input 0 stands for dims 2 and 3"),
        ("i,j", [(2,)], "2 input terms for 1 inputs"),
        ("i1->i", [(2, 2)], "invalid character '1'"),
        ("...ij->ij", [(4, 2, 3)], "output term has no '...'"),
    ],
)
def test_einsum_errors(equation: str, shapes: list[tuple[int, ...]], message: str) -> None:
    b = Builder()
    xs = [b.input(f"x{i}", TensorType(DType.f32, s)) for i, s in enumerate(shapes)]
    with pytest.raises(ShapeError, match=message.replace("(", r"\(").replace(".", r"\.")):
        b.add1("einsum", xs, {"equation": equation})
